{{/*
Per-role placement (workerGroups[].roles, placement, podDisruptionBudget): combinations that cannot work are refused
here in one line. A role's actors ask for its custom Ray resource, so they can only land on its groups' pods: those
pods must exist and offer the GPUs the role's actors ask for.
*/}}
{{- define "sc-app.validatePlacement" -}}
{{- $v := .Values -}}
{{- $cfg := default (dict) $v.config -}}
{{- $pdb := $v.podDisruptionBudget -}}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.minAvailable)) (not (kindIs "invalid" $pdb.maxUnavailable)) -}}
{{- fail "podDisruptionBudget: set minAvailable or maxUnavailable, not both (the API server refuses both); set maxUnavailable: null to use minAvailable" -}}
{{- end -}}
{{- range $i, $g := $v.workerGroups -}}
{{- if and $g.roles (hasKey (default (dict) $g.rayStartParams) "resources") -}}
{{- fail (printf "workerGroups[%d] (%s) sets rayStartParams.resources and roles: the chart gives the roles' Ray resources through the group's resources field, and KubeRay refuses both; drop rayStartParams.resources" $i $g.name) -}}
{{- end -}}
{{- if and $g.roles (eq (int $g.replicas) 0) -}}
{{- fail (printf "workerGroups[%d] (%s) hosts roles %v with replicas=0: those actors would wait for a pod that never comes; give it replicas or move the roles" $i $g.name $g.roles) -}}
{{- end -}}
{{- end -}}
{{- $roles := include "sc-app.hostedRoles" . | fromJson -}}
{{- if hasKey $roles "data_plane" -}}
{{- $dp := default (dict) $cfg.data_plane -}}
{{- $want := include "sc-app.roleResource" "data_plane" -}}
{{- if and $dp.storage_node_resource (ne $dp.storage_node_resource $want) -}}
{{- fail (printf "config.data_plane.storage_node_resource=%s but a worker group has role data_plane, which places storage units by %s; drop the config value or the role" $dp.storage_node_resource $want) -}}
{{- end -}}
{{- end -}}
{{- range $role := list "trainer" "generation" -}}
{{- if hasKey $roles $role -}}
{{- $a := default (dict) (get $cfg $role) -}}
{{- $n := add (default 1 $a.num_workers | int) (default 0 $a.spare_ranks | int) -}}
{{- $each := default 0 $a.num_gpus | float64 -}}
{{- $slots := 0 -}}
{{- $names := list -}}
{{- range $g := $v.workerGroups -}}
{{- if has $role (default (list) $g.roles) -}}
{{- $names = append $names $g.name -}}
{{- $pod := include "sc-app.podGpus" $g | float64 -}}
{{- if gt $each 0.0 -}}
{{- $slots = add $slots (mul (floor (divf $pod $each) | int) (int $g.replicas)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (gt $each 0.0) (lt $slots $n) -}}
{{- fail (printf "config.%s: %d workers (spare ranks included) x num_gpus=%v fit only %d times on the groups with role %s (%s: replicas x GPUs per pod); its actors can land nowhere else: add GPUs or replicas there, or lower config.%s" $role $n $each $slots $role (join ", " $names) $role) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $v.placement.sameZone (not $v.workerGroups) -}}
{{- fail "placement.sameZone=true with no worker groups: one pod is always in one zone; drop it" -}}
{{- end -}}
{{- end -}}
