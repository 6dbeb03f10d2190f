{{/*
Names, labels and small derived values shared by every template.
Invariant: every pod of the release carries the selector labels, which is what the NetworkPolicy admits.
*/}}

{{- define "sc-app.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sc-app.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "sc-app.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sc-app.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sc-app.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sc-app.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "sc-app.podLabels" -}}
{{ include "sc-app.selectorLabels" . }}
{{- with .Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sc-app.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository .Values.image.tag -}}
{{- end -}}
{{- end -}}

{{- define "sc-app.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "sc-app.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "sc-app.claimName" -}}
{{- if .Values.checkpoint.persistence.create -}}
{{- printf "%s-ckpt" (include "sc-app.fullname" .) -}}
{{- else -}}
{{- .Values.checkpoint.persistence.existingClaim -}}
{{- end -}}
{{- end -}}

{{- define "sc-app.authSecretName" -}}
{{- default (printf "%s-ray-auth" (include "sc-app.fullname" .)) .Values.rayAuth.existingSecret -}}
{{- end -}}

{{- define "sc-app.configPath" -}}/etc/sc-app/config.yaml{{- end -}}

{{/* The entrypoint, one string (RayJob.spec.entrypoint is run by a shell on the head). */}}
{{- define "sc-app.entrypoint" -}}
{{- $args := list "sc-app" "run" "--config" (include "sc-app.configPath" .) -}}
{{- range .Values.job.extraArgs }}{{ $args = append $args (squote .) }}{{ end -}}
{{- join " " $args -}}
{{- end -}}

{{/* The sc-app config as mounted: user config with checkpoint.dir and ray.address forced. */}}
{{- define "sc-app.config" -}}
{{- $forced := dict "checkpoint" (dict "dir" .Values.checkpoint.mountPath) "ray" (dict "address" "auto") -}}
{{- $cfg := mustMergeOverwrite (deepCopy (default (dict) .Values.config)) $forced -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* `ray start` flags that pin Ray's ports (same on head and workers). */}}
{{- define "sc-app.portParams" -}}
{{- $p := .Values.rayPorts -}}
node-manager-port: {{ $p.nodeManager | quote }}
object-manager-port: {{ $p.objectManager | quote }}
runtime-env-agent-port: {{ $p.runtimeEnvAgent | quote }}
dashboard-agent-grpc-port: {{ $p.dashboardAgentGrpc | quote }}
dashboard-agent-listen-port: {{ $p.dashboardAgentHttp | quote }}
metrics-export-port: {{ $p.metrics | quote }}
min-worker-port: {{ $p.minWorkerPort | quote }}
max-worker-port: {{ $p.maxWorkerPort | quote }}
{{- end -}}

{{/* Env shared by every sc-app container (Ray containers and preflight). */}}
{{- define "sc-app.env" -}}
- name: SC_APP_CHECKPOINT_DIR
  value: {{ .Values.checkpoint.mountPath | quote }}
{{- if .Values.checkpoint.hmac.existingSecret }}
- name: SC_APP_CHECKPOINT_HMAC_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.checkpoint.hmac.existingSecret }}
      key: {{ .Values.checkpoint.hmac.secretKey }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "sc-app.volumes" -}}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ include "sc-app.claimName" . }}
- name: ray-tmp
  emptyDir: {}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
{{- end -}}

{{- define "sc-app.volumeMounts" -}}
- name: checkpoints
  mountPath: {{ .Values.checkpoint.mountPath }}
- name: ray-tmp
  mountPath: /tmp/ray
- name: dshm
  mountPath: /dev/shm
{{- end -}}

{{/* Number of pods that mount the checkpoint claim at the most (head + every worker replica). */}}
{{- define "sc-app.mountingPods" -}}
{{- $n := 1 -}}
{{- range .Values.workerGroups -}}
{{- $max := .maxReplicas | default .replicas | int -}}
{{- $n = add $n $max -}}
{{- end -}}
{{- $n -}}
{{- end -}}
