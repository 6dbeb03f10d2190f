{{/*
rayClusterSpec shared by the RayJob and the standalone RayCluster.
Invariants: head and every worker mount the same claim at checkpoint.mountPath (checkpoint.volume=local: each pod
its own directory there, and config.checkpoint.remote.url is set, the bucket being what the pods share); the head's preflight
initContainer (same image, same mount) runs before the head's Ray container, so the restore decision is
taken before any driver exists; every pod carries the release's selector labels (NetworkPolicy); every Ray
container stops the run through its preStop hook before the kubelet's SIGTERM (sc-app.podTemplate).
*/}}
{{- define "sc-app.rayClusterSpec" -}}
{{- $root := . -}}
rayVersion: {{ .Values.rayVersion | quote }}
{{- if .Values.rayAuth.enabled }}
authOptions:
  mode: token
  secretName: {{ include "sc-app.authSecretName" . }}
{{- end }}
# Fixed-size groups (replicas = min = max): see workerGroups[].replicas in values.yaml.
enableInTreeAutoscaling: false
headGroupSpec:
  rayStartParams:
    {{- $head := merge (dict "port" (toString .Values.rayPorts.gcs) "dashboard-port" (toString .Values.rayPorts.dashboard) "ray-client-server-port" (toString .Values.rayPorts.client)) (include "sc-app.portParams" . | fromYaml) (deepCopy .Values.head.rayStartParams) }}
    {{- range $k, $val := $head }}
    {{ $k }}: {{ $val | toString | quote }}
    {{- end }}
  template:
    {{- include "sc-app.podTemplate" (dict "root" . "group" .Values.head "role" "head") | nindent 4 }}
{{- if .Values.workerGroups }}
workerGroupSpecs:
{{- range .Values.workerGroups }}
  - groupName: {{ .name }}
    replicas: {{ .replicas }}
    minReplicas: {{ .replicas }}
    maxReplicas: {{ .replicas }}
    {{- with .roles }}
    # The roles' custom Ray resources (sc-app.roleResource): the chart's config asks for them, so the roles'
    # actors land only on this group's pods. A tag, not a count: each actor asks for 1.
    resources:
      {{- range $r := . }}
      {{ include "sc-app.roleResource" $r }}: "1000"
      {{- end }}
    {{- end }}
    rayStartParams:
      {{- $w := merge (include "sc-app.portParams" $root | fromYaml) (deepCopy (default (dict) .rayStartParams)) }}
      {{- range $k, $val := $w }}
      {{ $k }}: {{ $val | toString | quote }}
      {{- end }}
    template:
      {{- include "sc-app.podTemplate" (dict "root" $root "group" . "role" "worker") | nindent 6 }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The PodTemplateSpec of the head and of every worker group: one definition, so they cannot drift.
Called with (dict "root" $ "group" <head or workerGroups[i] values> "role" "head"|"worker").
Only the head has the preflight initContainer and the head ports; everything else is the same.
*/}}
{{- define "sc-app.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $g := .group -}}
{{- $head := eq .role "head" -}}
{{- $envArgs := dict "root" $root "group" $g -}}
{{- $env := include "sc-app.env" $envArgs -}}
{{- $envFrom := include "sc-app.envFrom" $envArgs -}}
{{- $shm := include "sc-app.shmSize" $g -}}
{{- $annotations := merge (deepCopy (default (dict) $g.podAnnotations)) (deepCopy (default (dict) $v.podAnnotations)) -}}
metadata:
  labels:
    {{- include "sc-app.podLabels" $root | nindent 4 }}
    {{- with $g.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    sc-app/role: {{ .role }}
    {{- if not $head }}
    sc-app/worker-group: {{ $g.name }}
    {{- end }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "sc-app.serviceAccountName" $root }}
  automountServiceAccountToken: {{ $v.serviceAccount.automountToken }}
  securityContext:
    {{- toYaml $v.podSecurityContext | nindent 4 }}
  terminationGracePeriodSeconds: {{ $g.terminationGracePeriodSeconds }}
  {{- with $g.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $g.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $g.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with include "sc-app.affinity" (dict "root" $root "group" $g) }}
  affinity:
    {{- . | nindent 4 }}
  {{- end }}
  {{- with $g.topologySpread }}
  topologySpreadConstraints:
    - maxSkew: {{ .maxSkew | default 1 }}
      topologyKey: {{ .topologyKey | default "kubernetes.io/hostname" }}
      whenUnsatisfiable: {{ .whenUnsatisfiable | default "DoNotSchedule" }}
      labelSelector:
        matchLabels:
          {{- include "sc-app.selectorLabels" $root | nindent 10 }}
          sc-app/role: {{ $.role }}
          {{- if not $head }}
          sc-app/worker-group: {{ $g.name }}
          {{- end }}
  {{- end }}
  {{- if $head }}
  initContainers:
    - name: preflight
      image: {{ include "sc-app.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      # JSON on stdout: `sc-app k8s status` reads the resume decision from this container's log.
      command:
        - sc-app
        - preflight
        - --checkpoint-dir
        - {{ $v.checkpoint.mountPath | quote }}
        - --config
        - {{ include "sc-app.configPath" $root | quote }}
        - --json
      {{- with $env }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with $envFrom }}
      envFrom:
        {{- . | nindent 8 }}
      {{- end }}
      resources:
        {{- toYaml $g.preflightResources | nindent 8 }}
      securityContext:
        {{- include "sc-app.containerSecurityContext" $root | nindent 8 }}
      volumeMounts:
        - name: checkpoints
          mountPath: {{ $v.checkpoint.mountPath }}
        - name: config
          mountPath: {{ include "sc-app.configDir" $root }}
          readOnly: true
        {{- include "sc-app.scratchMounts" $root | nindent 8 }}
        {{- include "sc-app.hmacMounts" $root | nindent 8 }}
        {{- include "sc-app.awsIdentityMounts" $root | nindent 8 }}
  {{- end }}
  containers:
    - name: {{ ternary "ray-head" "ray-worker" $head }}
      image: {{ include "sc-app.image" $root }}
      imagePullPolicy: {{ $v.image.pullPolicy }}
      {{- with $env }}
      env:
        {{- . | nindent 8 }}
      {{- end }}
      {{- with $envFrom }}
      envFrom:
        {{- . | nindent 8 }}
      {{- end }}
      ports:
        {{- if $head }}
        - {name: gcs-server, containerPort: {{ $v.rayPorts.gcs }}}
        - {name: dashboard, containerPort: {{ $v.rayPorts.dashboard }}}
        - {name: client, containerPort: {{ $v.rayPorts.client }}}
        {{- end }}
        - {name: metrics, containerPort: {{ $v.rayPorts.metrics }}}
      # The kubelet runs this to completion (bounded by terminationGracePeriodSeconds) before it sends
      # SIGTERM: the run holding the checkpoint volume's lease finishes its step, publishes a bundle of it
      # and exits 143 (KubeRay retries), whether this pod is the head or a worker (values.yaml preStop).
      lifecycle:
        preStop:
          exec:
            command:
              - sc-app
              - stop
              - --checkpoint-dir
              - {{ $v.checkpoint.mountPath | quote }}
              - --wait
              - {{ $v.preStop.waitSeconds | quote }}
      resources:
        {{- include "sc-app.rayResources" (dict "resources" $g.resources "root" $root) | nindent 8 }}
      securityContext:
        {{- include "sc-app.containerSecurityContext" $root | nindent 8 }}
      volumeMounts:
        - name: checkpoints
          mountPath: {{ $v.checkpoint.mountPath }}
        - name: config
          mountPath: {{ include "sc-app.configDir" $root }}
          readOnly: true
        {{- if eq $v.model.source "claim" }}
        - name: model
          mountPath: {{ $v.model.mountPath }}
          readOnly: true
        {{- end }}
        {{- include "sc-app.scratchMounts" $root | nindent 8 }}
        {{- include "sc-app.hmacMounts" $root | nindent 8 }}
        {{- include "sc-app.awsIdentityMounts" $root | nindent 8 }}
        - name: ray-tmp
          mountPath: /tmp/ray
        - name: dshm
          mountPath: /dev/shm
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with $g.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    {{- $sc := include "sc-app.containerSecurityContext" $root | fromYaml }}
    {{- range concat (default (list) $v.extraContainers) (default (list) $g.extraContainers) }}
    {{- $c := deepCopy . }}
    {{- $_ := set $c "securityContext" (merge (deepCopy (default (dict) $c.securityContext)) (deepCopy $sc)) }}
    -
      {{- toYaml $c | nindent 6 }}
    {{- end }}
  volumes:
    {{- include "sc-app.checkpointVolume" $root | nindent 4 }}
    - name: config
      configMap:
        name: {{ include "sc-app.fullname" $root }}-config
    {{- if eq $v.model.source "claim" }}
    - name: model
      persistentVolumeClaim:
        claimName: {{ $v.model.existingClaim }}
        readOnly: true
    {{- end }}
    - name: ray-tmp
      emptyDir:
        {{- with $v.scratch.raySizeLimit }}
        sizeLimit: {{ . }}
        {{- else }} {}
        {{- end }}
    {{- include "sc-app.scratchVolumes" $root | nindent 4 }}
    {{- include "sc-app.hmacVolumes" $root | nindent 4 }}
    {{- include "sc-app.awsIdentityVolumes" $root | nindent 4 }}
    # Ray's object store lives in /dev/shm; sized like KubeRay does unless shmSize says otherwise.
    - name: dshm
      emptyDir:
        medium: Memory
        {{- with $shm }}
        sizeLimit: {{ . }}
        {{- end }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with $g.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}
