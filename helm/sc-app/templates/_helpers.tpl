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

{{/* Labels of the RayJob/RayCluster object itself: the chart's plus `labels` (queue names for Kueue, KAI...). */}}
{{- define "sc-app.objectLabels" -}}
{{- $labels := merge (include "sc-app.labels" . | fromYaml) (deepCopy (default (dict) .Values.labels)) -}}
{{- toYaml $labels -}}
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

{{/*
The pod volume "checkpoints": the shared claim (checkpoint.volume=shared), or each pod's own directory
(checkpoint.volume=local): an emptyDir, or a ReadWriteOnce claim per pod (a generic ephemeral volume, deleted with
the pod). With local, the bucket of config.checkpoint.remote.url is what outlives the pods (validateVolumes).
*/}}
{{- define "sc-app.checkpointVolume" -}}
{{- $c := .Values.checkpoint -}}
- name: checkpoints
{{- if ne $c.volume "local" }}
  persistentVolumeClaim:
    claimName: {{ include "sc-app.claimName" . }}
{{- else if eq $c.local.medium "ephemeral" }}
  ephemeral:
    volumeClaimTemplate:
      metadata:
        labels:
          {{- include "sc-app.selectorLabels" . | nindent 10 }}
      spec:
        accessModes: [ReadWriteOnce]
        {{- with $c.local.storageClassName }}
        storageClassName: {{ . }}
        {{- end }}
        resources:
          requests:
            storage: {{ $c.local.size }}
{{- else }}
  emptyDir:
    {{- with $c.local.sizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- end }}
{{- end -}}

{{- define "sc-app.authSecretName" -}}
{{- default (printf "%s-ray-auth" (include "sc-app.fullname" .)) .Values.rayAuth.existingSecret -}}
{{- end -}}

{{/* Where the ConfigMap is mounted; the one place that names it. */}}
{{- define "sc-app.configDir" -}}/etc/sc-app{{- end -}}

{{- define "sc-app.configPath" -}}{{ include "sc-app.configDir" . }}/config.yaml{{- end -}}

{{/* The entrypoint, one string (RayJob.spec.entrypoint is run by a shell on the head). */}}
{{- define "sc-app.entrypoint" -}}
{{- $args := list "sc-app" "run" "--config" (include "sc-app.configPath" .) -}}
{{- range .Values.job.extraArgs }}{{ $args = append $args (squote .) }}{{ end -}}
{{- join " " $args -}}
{{- end -}}

{{/* Directory of the policy model inside the pods ("" when model.source is unset). */}}
{{- define "sc-app.modelPath" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "claim" -}}
{{- printf "%s/%s" (trimSuffix "/" $m.mountPath) (trimPrefix "/" $m.path) | trimSuffix "/" -}}
{{- else if eq $m.source "image" -}}
{{- $m.path -}}
{{- end -}}
{{- end -}}

{{/* The sc-app config as mounted: user config with checkpoint.dir, ray.address (and model.path) forced, and each
role some worker group hosts mapped to its custom Ray resource (sc-app.roleResource). */}}
{{- define "sc-app.config" -}}
{{- $forced := dict "checkpoint" (dict "dir" .Values.checkpoint.mountPath) "ray" (dict "address" "auto") -}}
{{- if eq .Values.checkpoint.volume "local" }}{{ $_ := set $forced.checkpoint "volume" "local" }}{{ end -}}
{{- with include "sc-app.modelPath" . }}{{ $_ := set $forced "model" (dict "path" .) }}{{ end -}}
{{- $roles := include "sc-app.hostedRoles" . | fromJson -}}
{{- range $role := list "trainer" "generation" -}}
{{- if hasKey $roles $role -}}
{{- $_ := set $forced $role (dict "resources" (dict (include "sc-app.roleResource" $role) 1)) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $roles "data_plane" -}}
{{- $_ := set $forced "data_plane" (dict "storage_node_resource" (include "sc-app.roleResource" "data_plane")) -}}
{{- end -}}
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

{{/*
Env of an sc-app container: the HMAC keyring's path, the release's extraEnv, then the group's.
Called with (dict "root" $ "group" <head or worker group values>).
*/}}
{{- define "sc-app.env" -}}
{{- $v := .root.Values -}}
{{- if $v.checkpoint.hmac.existingSecret }}
# The keyring's directory (a path, not the key): Ray processes see where the keys are mounted, never a key.
- name: SC_APP_CHECKPOINT_HMAC_KEY_FILE
  value: {{ $v.checkpoint.hmac.mountPath | quote }}
{{- end }}
{{- with $v.checkpoint.awsWebIdentity }}{{ if .roleArn }}
# The bucket's credentials: boto3 exchanges this projected token for the role's at STS (checkpoint.awsWebIdentity).
- name: AWS_ROLE_ARN
  value: {{ .roleArn | quote }}
- name: AWS_WEB_IDENTITY_TOKEN_FILE
  value: {{ printf "%s/token" (trimSuffix "/" .mountPath) | quote }}
{{- end }}{{ end }}
{{- if $v.logs.toStderr }}
- name: RAY_LOG_TO_STDERR
  value: "1"
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- with .group.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The release's extraEnvFrom, then the group's (same argument as sc-app.env). */}}
{{- define "sc-app.envFrom" -}}
{{- with .root.Values.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- with .group.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
/dev/shm size of a group: its shmSize, else its container's memory limit, else its request, else "" (no limit).
That is what KubeRay injects when the pod has no /dev/shm of its own (pod.go makeEmptyDirVolume).
*/}}
{{- define "sc-app.shmSize" -}}
{{- $res := default (dict) .resources -}}
{{- $limits := default (dict) $res.limits -}}
{{- $requests := default (dict) $res.requests -}}
{{- coalesce .shmSize $limits.memory $requests.memory | default "" -}}
{{- end -}}

{{/*
GPUs Ray advertises on one pod of a group, the way KubeRay derives num-gpus: rayStartParams num-gpus when set,
else the first (sorted) resource limit whose name ends in "gpu" (e.g. nvidia.com/gpu) or is an NVIDIA MIG slice.
*/}}
{{- define "sc-app.podGpus" -}}
{{- $params := default (dict) .rayStartParams -}}
{{- $res := default (dict) .resources -}}
{{- $limits := default (dict) $res.limits -}}
{{- $gpus := 0.0 -}}
{{- if hasKey $params "num-gpus" -}}
{{- $gpus = index $params "num-gpus" | float64 -}}
{{- else -}}
{{- range $name := keys $limits | sortAlpha -}}
{{- $n := index $limits $name | float64 -}}
{{- if and (eq $gpus 0.0) (gt $n 0.0) (or (hasSuffix "gpu" $name) (hasPrefix "nvidia.com/mig-" $name)) -}}
{{- $gpus = $n -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $gpus -}}
{{- end -}}

{{/* Number of pods that mount the checkpoint claim (head + every worker replica). */}}
{{- define "sc-app.mountingPods" -}}
{{- $n := 1 -}}
{{- range .Values.workerGroups -}}
{{- $n = add $n (int .replicas) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/*
spec.suspend of the RayJob: job.suspend, or true when the live RayJob is suspended (`sc-app k8s suspend`, Kueue
holding it in a queue), so `helm upgrade` never resumes a job by surprise. Without cluster access (helm template,
GitOps) `lookup` finds nothing and job.suspend is rendered as given.
*/}}
{{- define "sc-app.suspend" -}}
{{- $live := lookup "ray.io/v1" "RayJob" .Release.Namespace (include "sc-app.fullname" .) -}}
{{- $liveSuspended := eq (toString (dig "spec" "suspend" false $live)) "true" -}}
{{- or .Values.job.suspend $liveSuspended -}}
{{- end -}}

{{/* The image user's home (Dockerfile: useradd --home-dir); an emptyDir there with scratch.readOnlyRootFilesystem. */}}
{{- define "sc-app.homeDir" -}}/home/scapp{{- end -}}

{{/* securityContext of every container: containerSecurityContext, read-only root with scratch.readOnlyRootFilesystem. */}}
{{- define "sc-app.containerSecurityContext" -}}
{{- $sc := deepCopy (default (dict) .Values.containerSecurityContext) -}}
{{- if .Values.scratch.readOnlyRootFilesystem -}}{{- $_ := set $sc "readOnlyRootFilesystem" true -}}{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/*
A Ray container's resources with scratch.ephemeralStorage added (request and limit of `ephemeral-storage`: the
emptyDirs /tmp, $HOME and /tmp/ray, logs). Left as given when the group's resources name ephemeral-storage.
Call with (dict "resources" <resources> "root" $).
*/}}
{{- define "sc-app.rayResources" -}}
{{- $r := deepCopy (default (dict) .resources) -}}
{{- $e := .root.Values.scratch.ephemeralStorage -}}
{{- $named := or (hasKey (default (dict) $r.requests) "ephemeral-storage") (hasKey (default (dict) $r.limits) "ephemeral-storage") -}}
{{- if not $named -}}
{{- range $part, $key := dict "requests" "request" "limits" "limit" -}}
{{- with index $e $key -}}
{{- $m := deepCopy (default (dict) (index $r $part)) -}}
{{- $_ := set $m "ephemeral-storage" . -}}
{{- $_ := set $r $part $m -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}

{{/* volumeMounts that make a read-only root usable (/tmp, $HOME); nothing without scratch.readOnlyRootFilesystem. */}}
{{- define "sc-app.scratchMounts" -}}
{{- if .Values.scratch.readOnlyRootFilesystem }}
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: {{ include "sc-app.homeDir" . }}
{{- end }}
{{- end -}}

{{/* The emptyDirs behind sc-app.scratchMounts. */}}
{{- define "sc-app.scratchVolumes" -}}
{{- if .Values.scratch.readOnlyRootFilesystem }}
{{- range $name := list "tmp" "home" }}
- name: {{ $name }}
  emptyDir:
    {{- with $.Values.scratch.tmpSizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret keys of the HMAC keyring, oldest first (the last signs): checkpoint.hmac.keys, else [secretKey]. */}}
{{- define "sc-app.hmacKeys" -}}
{{- $h := .Values.checkpoint.hmac -}}
{{- toJson (default (list $h.secretKey) $h.keys) -}}
{{- end -}}

{{/* The keyring mounted read-only where SC_APP_CHECKPOINT_HMAC_KEY_FILE points (every sc-app container). */}}
{{- define "sc-app.hmacMounts" -}}
{{- if .Values.checkpoint.hmac.existingSecret }}
- name: hmac-keys
  mountPath: {{ .Values.checkpoint.hmac.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The projected ServiceAccount token for AWS web identity (checkpoint.awsWebIdentity), every sc-app container. */}}
{{- define "sc-app.awsIdentityMounts" -}}
{{- with .Values.checkpoint.awsWebIdentity }}{{ if .roleArn }}
- name: aws-web-identity
  mountPath: {{ .mountPath }}
  readOnly: true
{{- end }}{{ end }}
{{- end -}}

{{- define "sc-app.awsIdentityVolumes" -}}
{{- with .Values.checkpoint.awsWebIdentity }}{{ if .roleArn }}
- name: aws-web-identity
  projected:
    sources:
      - serviceAccountToken:
          audience: {{ .audience | quote }}
          expirationSeconds: {{ .expirationSeconds }}
          path: token
{{- end }}{{ end }}
{{- end -}}

{{/*
The Secret as a directory of key files named 00-<key>, 01-<key>, ... in keyring order, so the name that sorts last
(sc_app.checkpoint.hmac_keys) is the newest key whatever the keys are called; group-readable by fsGroup only.
*/}}
{{- define "sc-app.hmacVolumes" -}}
{{- $h := .Values.checkpoint.hmac -}}
{{- if $h.existingSecret }}
- name: hmac-keys
  secret:
    secretName: {{ $h.existingSecret }}
    defaultMode: 0440
    items:
      {{- range $i, $k := include "sc-app.hmacKeys" . | fromJsonArray }}
      - key: {{ $k }}
        path: {{ printf "%02d-%s" $i $k }}
      {{- end }}
{{- end }}
{{- end -}}

{{/* The custom Ray resource of an sc-app role: sc_app_trainer, sc_app_generation, sc_app_data_plane. */}}
{{- define "sc-app.roleResource" -}}sc_app_{{ . }}{{- end -}}

{{/* Roles some worker group with pods hosts, as a JSON object role -> true. */}}
{{- define "sc-app.hostedRoles" -}}
{{- $out := dict -}}
{{- range .Values.workerGroups -}}
{{- if gt (int .replicas) 0 -}}
{{- range $r := default (list) .roles -}}{{- $_ := set $out $r true -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
A group's pod affinity with placement.sameZone merged in: a required podAffinity term on the release's pods over
placement.zoneKey, appended to the group's own terms. Called with (dict "root" $ "group" <group values>).
*/}}
{{- define "sc-app.affinity" -}}
{{- $aff := deepCopy (default (dict) .group.affinity) -}}
{{- if .root.Values.placement.sameZone -}}
{{- $pa := default (dict) $aff.podAffinity -}}
{{- $terms := default (list) $pa.requiredDuringSchedulingIgnoredDuringExecution -}}
{{- $sel := dict "matchLabels" (include "sc-app.selectorLabels" .root | fromYaml) -}}
{{- $terms = append $terms (dict "labelSelector" $sel "topologyKey" .root.Values.placement.zoneKey) -}}
{{- $_ := set $pa "requiredDuringSchedulingIgnoredDuringExecution" $terms -}}
{{- $_ := set $aff "podAffinity" $pa -}}
{{- end -}}
{{- with $aff }}{{ toYaml . }}{{ end -}}
{{- end -}}
