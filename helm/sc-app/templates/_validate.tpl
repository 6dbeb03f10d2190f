{{/*
Cross-field rules values.schema.json cannot express. Each failure is one line naming the value and the fix.
Invariant: a release that renders can be scheduled without two pods fighting over a ReadWriteOnce claim,
and every GPU group asks Kubernetes for the GPUs Ray will advertise.
*/}}
{{- define "sc-app.validate" -}}
{{- $v := .Values -}}
{{- if and (not $v.image.tag) (not $v.image.digest) -}}
{{- fail "image.tag is required (or image.digest): a retried job must run the same image as the attempt it resumes; pass --set image.tag=<version>" -}}
{{- end -}}
{{- if not (has $v.job.submissionMode (list "K8sJobMode" "HTTPMode" "SidecarMode" "InteractiveMode")) -}}
{{- fail (printf "job.submissionMode %q is not one of K8sJobMode, HTTPMode, SidecarMode, InteractiveMode" $v.job.submissionMode) -}}
{{- end -}}
{{- if lt (int $v.job.backoffLimit) 0 -}}
{{- fail (printf "job.backoffLimit must be >= 0 (got %v): it is the number of retries after a preemption" $v.job.backoffLimit) -}}
{{- end -}}
{{- $p := $v.checkpoint.persistence -}}
{{- if and (not $p.create) (not $p.existingClaim) -}}
{{- fail "checkpoint.persistence.existingClaim is required when checkpoint.persistence.create=false" -}}
{{- end -}}
{{- if and $p.create $p.existingClaim -}}
{{- fail "checkpoint.persistence: set either create=true or existingClaim, not both" -}}
{{- end -}}
{{- $modes := $p.accessModes -}}
{{- if $p.existingClaim -}}
{{- $live := lookup "v1" "PersistentVolumeClaim" .Release.Namespace $p.existingClaim -}}
{{- if $live -}}{{- $modes = $live.spec.accessModes -}}{{- end -}}
{{- end -}}
{{- $pods := include "sc-app.mountingPods" . | int -}}
{{- if and (gt $pods 1) (not (has "ReadWriteMany" $modes)) -}}
{{- fail (printf "checkpoint.persistence.accessModes %v: %d pods (head + workers) mount the checkpoint volume, which needs ReadWriteMany; use an RWX storage class or set workerGroups to []" $modes $pods) -}}
{{- end -}}
{{- $names := dict -}}
{{- range $i, $g := $v.workerGroups -}}
{{- if hasKey $names $g.name -}}
{{- fail (printf "workerGroups[%d].name %q is used twice; group names must be unique" $i $g.name) -}}
{{- end -}}
{{- $_ := set $names $g.name true -}}
{{- $min := $g.minReplicas | default $g.replicas | int -}}
{{- $max := $g.maxReplicas | default $g.replicas | int -}}
{{- if or (lt (int $g.replicas) $min) (gt (int $g.replicas) $max) -}}
{{- fail (printf "workerGroups[%d] (%s): need minReplicas <= replicas <= maxReplicas (got %d <= %d <= %d)" $i $g.name $min (int $g.replicas) $max) -}}
{{- end -}}
{{- $limits := dict -}}
{{- if $g.resources -}}{{- $limits = default (dict) $g.resources.limits -}}{{- end -}}
{{- $gpus := index $limits $g.gpuResource | default 0 | int -}}
{{- if and (eq $g.accelerator "gpu") (lt $gpus 1) -}}
{{- fail (printf "workerGroups[%d] (%s) is accelerator=gpu but requests no %s: set resources.limits.%s (Ray would advertise GPUs the pod does not have)" $i $g.name $g.gpuResource $g.gpuResource) -}}
{{- end -}}
{{- if and (eq $g.accelerator "cpu") (gt $gpus 0) -}}
{{- fail (printf "workerGroups[%d] (%s) is accelerator=cpu but requests %d %s; set accelerator=gpu" $i $g.name $gpus $g.gpuResource) -}}
{{- end -}}
{{- end -}}
{{- $cfg := default (dict) $v.config -}}
{{- if and (hasKey $cfg "checkpoint") (hasKey (default (dict) $cfg.checkpoint) "dir") -}}
{{- fail "config.checkpoint.dir is set by the chart from checkpoint.mountPath; remove it from config" -}}
{{- end -}}
{{- $budget := default 60 (default (dict) $cfg.checkpoint).emergency_budget_s -}}
{{- if ge (float64 $budget) (float64 $v.head.terminationGracePeriodSeconds) -}}
{{- fail (printf "config.checkpoint.emergency_budget_s (%v) must be below head.terminationGracePeriodSeconds (%v): the SIGTERM checkpoint has to finish before the pod is killed" $budget $v.head.terminationGracePeriodSeconds) -}}
{{- end -}}
{{- if and (hasKey $cfg "ray") (hasKey (default (dict) $cfg.ray) "address") -}}
{{- fail "config.ray.address is set by the chart (auto: join the KubeRay cluster); remove it from config" -}}
{{- end -}}
{{- end -}}
