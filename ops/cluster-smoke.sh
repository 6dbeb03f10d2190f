#!/usr/bin/env bash
# Real-cluster smoke: install the chart into NAMESPACE, wait for a step_N bundle, delete the head pod (a
# preemption), check that KubeRay retried and the new head's preflight resumed from a bundle, then uninstall.
# Needs: kubectl + helm pointed at a cluster with the KubeRay operator, an RWX storage class (or CPU values).
# Usage: ops/cluster-smoke.sh NAMESPACE [VALUES_FILE] [IMAGE_TAG]
set -euo pipefail
ns="${1:?usage: $0 NAMESPACE [VALUES_FILE] [IMAGE_TAG]}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
values="${2:-${repo}/helm/sc-app/ci/cpu-values.yaml}"
tag="${3:-0.1.0}"
release="smoke-$(date +%s)"
job="${release}-sc-app"
timeout_s="${SMOKE_TIMEOUT_S:-1800}"

say() { printf '[cluster-smoke] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
cleanup() {
  say "uninstalling ${release} (PVC ${job}-ckpt is kept; delete it by hand)"
  helm uninstall "${release}" -n "${ns}" > /dev/null 2>&1 || true
}
trap cleanup EXIT

status_json() { sc-app k8s status "${release}" -n "${ns}" --json; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin).get('$1'))"; }

helm install "${release}" "${repo}/helm/sc-app" -n "${ns}" --create-namespace -f "${values}" \
  --set image.tag="${tag}" --set config.checkpoint.save_period=2 > /dev/null
say "installed ${release}; waiting for the job to run and save a bundle"

deadline=$(( $(date +%s) + timeout_s ))
head=""
while :; do
  (( $(date +%s) < deadline )) || fail "no bundle within ${timeout_s}s"
  state=$(status_json | field jobDeploymentStatus)
  [[ "${state}" == "Failed" ]] && fail "job failed before the test preempted it"
  head=$(kubectl -n "${ns}" get pod -l "ray.io/node-type=head,app.kubernetes.io/instance=${release}" \
    -o jsonpath='{.items[0].metadata.name}' 2> /dev/null || true)
  if [[ "${state}" == "Running" && -n "${head}" ]] \
    && kubectl -n "${ns}" exec "${head}" -c ray-head -- sh -c 'ls -d /checkpoints/step_* > /dev/null 2>&1'; then
    break
  fi
  sleep 10
done
say "bundle present; deleting head pod ${head} (preemption)"
kubectl -n "${ns}" delete pod "${head}" --wait=false > /dev/null

while :; do
  (( $(date +%s) < deadline )) || fail "no resumed attempt within ${timeout_s}s"
  doc=$(status_json)
  retries=$(field retriesUsed <<< "${doc}")
  decision=$(field resumeDecision <<< "${doc}")
  if [[ "${retries}" -ge 1 && "${decision}" == "resume" ]]; then
    say "retry ${retries}: resumed from step $(field resumeStep <<< "${doc}")"
    break
  fi
  sleep 10
done
sc-app k8s wait "${release}" -n "${ns}" --timeout "${timeout_s}" || fail "job did not complete after the resume"
say "OK"
