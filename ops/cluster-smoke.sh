#!/usr/bin/env bash
# Real-cluster smoke: install the chart into NAMESPACE, wait until the driver has published a bundle (and it is on
# the volume, at the mount path the RayJob itself names), delete the head pod (a preemption), then require that a
# NEW head's driver resumed from a bundle at least that new, let the job complete, and remove the release (the
# RayJob first, waiting for KubeRay's finalizer, then helm uninstall; the PVC is kept).
# A lost head may be absorbed without a KubeRay retry: the RayCluster recreates the head pod and the K8sJobMode
# submitter submits the same job again, so `retriesUsed` may stay 0. The check is the resume, not the retry count.
# Also what only a live cluster shows (ops/README.md, "Only a live cluster proves"): the claim binds (the class
# really serves its access modes); the API server's proxy reaches the head through the NetworkPolicy (the live part
# answers, no policy named in liveError); KubeRay never ends the job with JobStatusCheckTimeoutExceeded while the
# head is replaced; `sc-app k8s suspend --wait` returns once the operator suspended the job and its pods are gone,
# and `resume` starts a new cluster that resumes (SMOKE_SUSPEND=0 skips that step); the training head's root is
# read-only (with scratch.readOnlyRootFilesystem, the default) and its /tmp writable; with checkpoint.hmac the key
# reaches the head as a mounted file only (no SC_APP_CHECKPOINT_HMAC_KEY in its environment), the saved manifest
# names its key id and verifies there; with workerGroups[].roles Ray advertises each role's sc_app_<role> resource
# (docs/kubernetes-placement.md).
# Needs: kubectl, helm and sc-app (k8s extra) for a cluster with the KubeRay operator, an RWX storage class (or CPU
# values), and RBAC for `sc-app k8s status`'s live part (ops/README.md). SMOKE_TIMEOUT_S (1800), SMOKE_POLL_S (10).
# Usage: ops/cluster-smoke.sh NAMESPACE [VALUES_FILE] [IMAGE_TAG]
set -euo pipefail
ns="${1:?usage: $0 NAMESPACE [VALUES_FILE] [IMAGE_TAG]}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
values="${2:-${repo}/helm/sc-app/ci/cpu-values.yaml}"
tag="${3:-0.1.0}"
release="smoke-$(date +%s)"
job="${release}-sc-app"
timeout_s="${SMOKE_TIMEOUT_S:-1800}"
poll_s="${SMOKE_POLL_S:-10}"
suspend_step="${SMOKE_SUSPEND:-1}"

say() { printf '[cluster-smoke] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
cleanup() {
  say "removing ${release} (PVC ${job}-ckpt is kept; delete it by hand)"
  kubectl -n "${ns}" delete rayjob "${job}" --wait --timeout=300s > /dev/null 2>&1 || true
  helm uninstall "${release}" -n "${ns}" > /dev/null 2>&1 || true
}
trap cleanup EXIT

status_json() { sc-app k8s status "${release}" -n "${ns}" --json; }
# field DOTTED.KEY < JSON: the value, "" for null/missing.
field() {
  python3 -c 'import json, sys
d = json.load(sys.stdin)
for k in sys.argv[1].split("."):
    d = d.get(k) if isinstance(d, dict) else None
print("" if d is None else d)' "$1"
}
# What KubeRay or the cluster got wrong, from one status document: fail with it.
live_only_checks() {
  [[ "$(field reason <<< "$1")" == "JobStatusCheckTimeoutExceeded" ]] \
    && fail "KubeRay ended the job with JobStatusCheckTimeoutExceeded (not retried): keep the head on on-demand nodes and raise RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (ops/RUNBOOKS.md section 12)"
  local live_error
  live_error=$(field liveError <<< "$1")
  [[ "${live_error}" == *"networkpolicy/"* ]] && fail "live status blocked: ${live_error}"
  return 0
}

helm install "${release}" "${repo}/helm/sc-app" -n "${ns}" --create-namespace -f "${values}" \
  --set image.tag="${tag}" --set config.checkpoint.save_period=2 > /dev/null
mount=$(kubectl -n "${ns}" get rayjob "${job}" -o json | python3 -c 'import json, sys
spec = json.load(sys.stdin)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
head = next(c for c in spec["containers"] if c["name"] == "ray-head")
print(next(m["mountPath"] for m in head["volumeMounts"] if m["name"] == "checkpoints"))') \
  || fail "rayjob/${job}: no checkpoints mount on its head container"
say "installed ${release}; checkpoints at ${mount}; waiting for the checkpoint claim to bind"

deadline=$(( $(date +%s) + timeout_s ))
claim=$(kubectl -n "${ns}" get rayjob "${job}" -o json | python3 -c 'import json, sys
spec = json.load(sys.stdin)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
print(next(v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if v["name"] == "checkpoints"))')
until [[ "$(kubectl -n "${ns}" get pvc "${claim}" -o jsonpath='{.status.phase}')" == "Bound" ]]; do
  if (( $(date +%s) >= deadline )); then
    fail "pvc/${claim} not Bound: $(sc-app k8s status "${release}" -n "${ns}" --no-live | grep '^claim ' || true)"
  fi
  sleep "${poll_s}"
done
say "pvc/${claim} Bound; waiting for the driver to publish a bundle"

old_head="" before=""
while :; do
  (( $(date +%s) < deadline )) || fail "no bundle within ${timeout_s}s"
  sleep "${poll_s}"
  doc=$(status_json) || continue  # the API server may blip; the deadline bounds the loop
  live_only_checks "${doc}"
  [[ "$(field jobDeploymentStatus <<< "${doc}")" == "Failed" ]] && fail "job failed before the test preempted it"
  old_head=$(field headPod <<< "${doc}")
  [[ "$(field live.newestBundleSource <<< "${doc}")" == "saved" ]] || continue
  before=$(field live.newestBundleStep <<< "${doc}")
  if [[ -n "${old_head}" ]] \
    && kubectl -n "${ns}" exec "${old_head}" -c ray-head -- test -d "${mount}/step_${before}"; then
    break
  fi
done
say "driver saved step_${before} (on the volume)"
# A read-only root (scratch.readOnlyRootFilesystem, the default) as the runtime gives it: the training head's root
# refuses a write, its /tmp emptyDir takes one.
ro_root=$(kubectl -n "${ns}" get rayjob "${job}" -o json | python3 -c 'import json, sys
spec = json.load(sys.stdin)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
head = next(c for c in spec["containers"] if c["name"] == "ray-head")
print(bool((head.get("securityContext") or {}).get("readOnlyRootFilesystem")))')
if [[ "${ro_root}" == "True" ]]; then
  probe=$(kubectl -n "${ns}" exec "${old_head}" -c ray-head -- sh -c \
    'touch /.sc-app-smoke 2>&1; touch /tmp/.sc-app-smoke && echo tmp-writable' 2>&1 || true)
  [[ "${probe}" == *"Read-only file system"*"tmp-writable"* ]] \
    || fail "head ${old_head}: expected a read-only root with a writable /tmp, got: ${probe}"
  say "head ${old_head}: root read-only, /tmp writable"
fi
# The HMAC keyring (checkpoint.hmac) and the roles' Ray resources (workerGroups[].roles), as the live head has them.
read -r ring roles < <(kubectl -n "${ns}" get rayjob "${job}" -o json | python3 -c 'import json, sys
spec = json.load(sys.stdin)["spec"]["rayClusterSpec"]
head = spec["headGroupSpec"]["template"]["spec"]
ring = any(v["name"] == "hmac-keys" for v in head.get("volumes", []))
roles = sorted({r for g in spec.get("workerGroupSpecs") or [] for r in (g.get("resources") or {}) if r.startswith("sc_app_")})
print(int(ring), ",".join(roles) or "-")')
if [[ "${ring}" == 1 ]]; then
  if kubectl -n "${ns}" exec "${old_head}" -c ray-head -- printenv SC_APP_CHECKPOINT_HMAC_KEY > /dev/null 2>&1; then
    fail "head ${old_head}: the HMAC key is in the environment (SC_APP_CHECKPOINT_HMAC_KEY); it must be a mounted file"
  fi
  manifest=$(kubectl -n "${ns}" exec "${old_head}" -c ray-head -- cat "${mount}/step_${before}/manifest.json") \
    || fail "cannot read step_${before}/manifest.json on ${old_head}"
  kid=$(python3 -c 'import json, sys; print((json.load(sys.stdin).get("signature") or {}).get("key_id", ""))' \
    <<< "${manifest}")
  [[ -n "${kid}" ]] || fail "step_${before} is not signed with a key id although checkpoint.hmac is set"
  kubectl -n "${ns}" exec "${old_head}" -c ray-head -- sc-app ckpt verify --checkpoint-dir "${mount}" > /dev/null \
    || fail "sc-app ckpt verify with the mounted keyring failed on ${old_head}"
  say "step_${before} signed by key id ${kid}; verified with the mounted keyring; no key in the head's environment"
fi
if [[ "${roles}" != "-" ]]; then
  ray_status=$(kubectl -n "${ns}" exec "${old_head}" -c ray-head -- ray status) || fail "ray status failed on ${old_head}"
  for r in ${roles//,/ }; do
    [[ "${ray_status}" == *"${r}"* ]] || fail "Ray does not advertise ${r} (workerGroups[].roles): ray status has no ${r}"
  done
  say "Ray advertises the roles' resources: ${roles}"
fi
say "deleting head pod ${old_head} (preemption)"
kubectl -n "${ns}" delete pod "${old_head}" --wait=false > /dev/null

while :; do
  (( $(date +%s) < deadline )) || fail "no new head resumed from a bundle within ${timeout_s}s"
  sleep "${poll_s}"
  doc=$(status_json) || continue
  live_only_checks "${doc}"
  [[ "$(field jobDeploymentStatus <<< "${doc}")" == "Failed" ]] && fail "job failed after the preemption"
  head=$(field headPod <<< "${doc}")
  [[ -n "${head}" && "${head}" != "${old_head}" ]] || continue
  if [[ "$(field live.freshStart <<< "${doc}")" == "True" ]]; then
    fail "the new driver on ${head} started fresh although step_${before} was published"
  fi
  resumed=$(field live.resumedFromStep <<< "${doc}")
  [[ -n "${resumed}" ]] || continue
  (( resumed >= before )) || fail "the new driver resumed from step ${resumed}, older than step_${before}"
  retries=$(field retriesUsed <<< "${doc}")
  how=$([[ "${retries}" == "0" ]] && echo "absorbed without a KubeRay retry" || echo "KubeRay retry ${retries}")
  say "new head ${head} resumed from step ${resumed} (${how})"
  break
done
if [[ "${suspend_step}" == "1" ]]; then
  say "suspend --wait: until the operator says Suspended and every pod of the job is gone"
  sc-app k8s suspend "${release}" -n "${ns}" --wait --timeout 600 > /dev/null || fail "suspend --wait did not finish"
  if [[ -n "$(kubectl -n "${ns}" get pods -l "ray.io/node-type,app.kubernetes.io/instance=${release}" -o name)" ]]; then
    fail "suspend --wait returned while pods of the job still exist"
  fi
  sc-app k8s resume "${release}" -n "${ns}" > /dev/null || fail "resume failed"
  say "suspended (no pods left) and resumed"
fi
left=$(( deadline - $(date +%s) ))
sc-app k8s wait "${release}" -n "${ns}" --timeout "$(( left > 0 ? left : 1 ))" \
  || fail "job did not complete after the resume"
say "OK"
