#!/usr/bin/env bash
# Start pod "ckpt-debug" with the RayJob's image and its checkpoint claim mounted at the same path, as the
# same non-root user, for `sc-app ckpt ...` / `sc-app preflight --dry-run`. Suspend the job first.
# Usage: ops/ckpt-shell.sh NAMESPACE RAYJOB_NAME
set -euo pipefail
ns="${1:?usage: $0 NAMESPACE RAYJOB_NAME}"
job="${2:?usage: $0 NAMESPACE RAYJOB_NAME}"
tmpl='{.spec.rayClusterSpec.headGroupSpec.template.spec}'
image=$(kubectl -n "${ns}" get rayjob "${job}" -o jsonpath="${tmpl%\}}.containers[0].image}")
claim=$(kubectl -n "${ns}" get rayjob "${job}" \
  -o jsonpath="${tmpl%\}}.volumes[?(@.name=='checkpoints')].persistentVolumeClaim.claimName}")
mount=$(kubectl -n "${ns}" get rayjob "${job}" \
  -o jsonpath="${tmpl%\}}.containers[0].volumeMounts[?(@.name=='checkpoints')].mountPath}")
[[ -n "${image}" && -n "${claim}" && -n "${mount}" ]] || { echo "rayjob/${job}: cannot read image/claim" >&2; exit 2; }
kubectl -n "${ns}" apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ckpt-debug
  labels: {app.kubernetes.io/component: ckpt-debug}
spec:
  restartPolicy: Never
  securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001, fsGroup: 10001}
  containers:
    - name: ckpt-debug
      image: ${image}
      command: ["sleep", "86400"]
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: checkpoints, mountPath: ${mount}}]
  volumes:
    - name: checkpoints
      persistentVolumeClaim: {claimName: ${claim}}
YAML
kubectl -n "${ns}" wait --for=condition=Ready pod/ckpt-debug --timeout=300s
echo "ready: kubectl -n ${ns} exec -it ckpt-debug -- sc-app ckpt list --checkpoint-dir ${mount}"
