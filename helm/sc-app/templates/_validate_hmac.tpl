{{/*
The HMAC keyring's Secret (checkpoint.hmac): it must exist before the pods need it. A pod whose Secret volume is
missing never starts (ContainerCreating, FailedMount), and KubeRay waits preRunningDeadlineSeconds on it per retry.
With cluster access (`helm install/upgrade`) the Secret is looked up: missing, or lacking a key of the ring, is
refused here. Without it (`helm template`, Argo CD: `lookup` returns nothing for every object) nothing can be known:
the kube-root-ca.crt ConfigMap, which every namespace has, tells the two apart, and `sc-app k8s submit` checks the
Secret itself before it writes anything.
*/}}
{{- define "sc-app.validateHmac" -}}
{{- $h := .Values.checkpoint.hmac -}}
{{- if $h.existingSecret -}}
{{- $mount := clean $h.mountPath -}}
{{- range $p := list .Values.checkpoint.mountPath "/tmp" "/tmp/ray" "/dev/shm" (include "sc-app.configDir" .) (include "sc-app.homeDir" .) -}}
{{- if or (eq $mount (clean $p)) (hasPrefix (printf "%s/" (clean $p)) $mount) (hasPrefix (printf "%s/" $mount) (clean $p)) -}}
{{- fail (printf "checkpoint.hmac.mountPath %s overlaps %s, which the pods mount too; choose a directory of its own (the default is one)" $h.mountPath $p) -}}
{{- end -}}
{{- end -}}
{{- $onCluster := lookup "v1" "ConfigMap" .Release.Namespace "kube-root-ca.crt" -}}
{{- if $onCluster -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace $h.existingSecret -}}
{{- if not $secret -}}
{{- fail (printf "checkpoint.hmac.existingSecret %s does not exist in namespace %s: every pod would wait in ContainerCreating for it; create it first (kubectl -n %s create secret generic %s --from-file=%s=<key file>) or set checkpoint.hmac.existingSecret=\"\" to hash without signing" $h.existingSecret .Release.Namespace .Release.Namespace $h.existingSecret (first (include "sc-app.hmacKeys" . | fromJsonArray))) -}}
{{- end -}}
{{- range $k := include "sc-app.hmacKeys" . | fromJsonArray -}}
{{- if not (hasKey (default (dict) $secret.data) $k) -}}
{{- fail (printf "checkpoint.hmac: secret/%s has no key %q (it has: %s); add it to the Secret or fix checkpoint.hmac.keys / secretKey" $h.existingSecret $k (keys (default (dict) $secret.data) | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
