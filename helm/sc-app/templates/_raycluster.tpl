{{/*
rayClusterSpec shared by the RayJob and the standalone RayCluster.
Invariants: head and every worker mount the same claim at checkpoint.mountPath; the head's preflight
initContainer (same image, same mount) runs before the head's Ray container, so the restore decision is
taken before any driver exists; every pod carries the release's selector labels (NetworkPolicy).
*/}}
{{- define "sc-app.rayClusterSpec" -}}
{{- $root := . -}}
{{- $image := include "sc-app.image" . -}}
rayVersion: {{ .Values.rayVersion | quote }}
{{- if .Values.rayAuth.enabled }}
authOptions:
  mode: token
  secretName: {{ include "sc-app.authSecretName" . }}
{{- end }}
headGroupSpec:
  rayStartParams:
    {{- $head := merge (dict "port" (toString .Values.rayPorts.gcs) "dashboard-port" (toString .Values.rayPorts.dashboard) "ray-client-server-port" (toString .Values.rayPorts.client)) (include "sc-app.portParams" . | fromYaml) (deepCopy .Values.head.rayStartParams) }}
    {{- range $k, $val := $head }}
    {{ $k }}: {{ $val | toString | quote }}
    {{- end }}
  template:
    metadata:
      labels:
        {{- include "sc-app.podLabels" . | nindent 8 }}
        sc-app/role: head
      {{- with .Values.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "sc-app.serviceAccountName" . }}
      automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ .Values.head.terminationGracePeriodSeconds }}
      {{- with .Values.head.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.head.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.head.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.head.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      initContainers:
        - name: preflight
          image: {{ $image }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          # JSON on stdout: `sc-app k8s status` reads the resume decision from this container's log.
          command:
            - sc-app
            - preflight
            - --checkpoint-dir
            - {{ .Values.checkpoint.mountPath | quote }}
            - --config
            - {{ include "sc-app.configPath" . | quote }}
            - --json
          env:
            {{- include "sc-app.env" . | nindent 12 }}
          resources:
            {{- toYaml .Values.head.preflightResources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            - name: checkpoints
              mountPath: {{ .Values.checkpoint.mountPath }}
            - name: config
              mountPath: /etc/sc-app
              readOnly: true
      containers:
        - name: ray-head
          image: {{ $image }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          env:
            {{- include "sc-app.env" . | nindent 12 }}
          ports:
            - {name: gcs-server, containerPort: {{ .Values.rayPorts.gcs }}}
            - {name: dashboard, containerPort: {{ .Values.rayPorts.dashboard }}}
            - {name: client, containerPort: {{ .Values.rayPorts.client }}}
            - {name: metrics, containerPort: {{ .Values.rayPorts.metrics }}}
          resources:
            {{- toYaml .Values.head.resources | nindent 12 }}
          securityContext:
            {{- toYaml .Values.containerSecurityContext | nindent 12 }}
          volumeMounts:
            {{- include "sc-app.volumeMounts" . | nindent 12 }}
            - name: config
              mountPath: /etc/sc-app
              readOnly: true
      volumes:
        {{- include "sc-app.volumes" . | nindent 8 }}
        - name: config
          configMap:
            name: {{ include "sc-app.fullname" . }}-config
{{- if .Values.workerGroups }}
workerGroupSpecs:
{{- range .Values.workerGroups }}
  - groupName: {{ .name }}
    replicas: {{ .replicas }}
    minReplicas: {{ .minReplicas | default .replicas }}
    maxReplicas: {{ .maxReplicas | default .replicas }}
    rayStartParams:
      {{- $w := merge (include "sc-app.portParams" $root | fromYaml) (deepCopy (default (dict) .rayStartParams)) }}
      {{- range $k, $val := $w }}
      {{ $k }}: {{ $val | toString | quote }}
      {{- end }}
    template:
      metadata:
        labels:
          {{- include "sc-app.podLabels" $root | nindent 10 }}
          sc-app/role: worker
          sc-app/worker-group: {{ .name }}
        {{- with $root.Values.podAnnotations }}
        annotations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
      spec:
        serviceAccountName: {{ include "sc-app.serviceAccountName" $root }}
        automountServiceAccountToken: {{ $root.Values.serviceAccount.automountToken }}
        securityContext:
          {{- toYaml $root.Values.podSecurityContext | nindent 10 }}
        terminationGracePeriodSeconds: {{ .terminationGracePeriodSeconds }}
        {{- with .priorityClassName }}
        priorityClassName: {{ . }}
        {{- end }}
        {{- with $root.Values.imagePullSecrets }}
        imagePullSecrets:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .nodeSelector }}
        nodeSelector:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .tolerations }}
        tolerations:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- with .affinity }}
        affinity:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        containers:
          - name: ray-worker
            image: {{ $image }}
            imagePullPolicy: {{ $root.Values.image.pullPolicy }}
            env:
              {{- include "sc-app.env" $root | nindent 14 }}
            resources:
              {{- toYaml .resources | nindent 14 }}
            securityContext:
              {{- toYaml $root.Values.containerSecurityContext | nindent 14 }}
            volumeMounts:
              {{- include "sc-app.volumeMounts" $root | nindent 14 }}
        volumes:
          {{- include "sc-app.volumes" $root | nindent 10 }}
{{- end }}
{{- end }}
{{- end -}}
