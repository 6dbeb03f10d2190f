#!/usr/bin/env bash
# Start pod "ckpt-debug" for `sc-app ckpt ...` / `sc-app preflight --dry-run` on a RayJob's checkpoint claim.
# Everything is read off the RayJob's head pod template, nothing guessed: image and pull secrets, the claim and its
# mount path, the pod's user/group, the head container's SC_APP_* env and its HMAC keyring (the hmac-keys Secret
# volume at SC_APP_CHECKPOINT_HMAC_KEY_FILE; a job of an older chart: SC_APP_CHECKPOINT_HMAC_KEY from its Secret),
# so `sc-app ckpt verify` in the pod checks manifest signatures like the job does. The pod passes
# the "restricted" Pod Security Standard (non-root, seccomp RuntimeDefault, no privilege escalation, all
# capabilities dropped, no service account token) and carries requests and limits (the preflight initContainer's)
# so namespaces with a ResourceQuota admit it. Suspend the job first: one writer on the volume.
# EXPORT_CLAIM (optional): a claim mounted read-write at /exports, where `sc-app export` writes a policy onto a
# volume (RUNBOOKS section 11): never into the checkpoint claim, whose root is checkpoint.dir (export refuses it).
# Usage: ops/ckpt-shell.sh NAMESPACE RAYJOB_NAME [EXPORT_CLAIM]        (needs kubectl and python3)
set -euo pipefail
ns="${1:?usage: $0 NAMESPACE RAYJOB_NAME [EXPORT_CLAIM]}"
job="${2:?usage: $0 NAMESPACE RAYJOB_NAME [EXPORT_CLAIM]}"
export_claim="${3:-}"
[[ -z "${export_claim}" || "${export_claim}" =~ ^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$ ]] \
  || { echo "EXPORT_CLAIM '${export_claim}' is not a claim name" >&2; exit 2; }
pod=ckpt-debug

# RayJob JSON on stdin -> the debug pod's JSON on stdout (line 1: mount path; line 2: HMAC note; line 3: pod).
build_pod='
import json, sys
job_name, pod_name, export_claim = sys.argv[1], sys.argv[2], sys.argv[3]
job = json.load(sys.stdin)
try:
    tmpl = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head = next((c for c in tmpl["containers"] if c.get("name") == "ray-head"), tmpl["containers"][0])
    mount = next(m["mountPath"] for m in head.get("volumeMounts", []) if m.get("name") == "checkpoints")
    claim = next(v["persistentVolumeClaim"]["claimName"] for v in tmpl.get("volumes", [])
                 if v.get("name") == "checkpoints")
except (KeyError, IndexError, StopIteration, TypeError):
    sys.exit(f"rayjob/{job_name}: no checkpoints volume/claim in its head pod template; not an sc-app RayJob?")
preflight = next((c for c in tmpl.get("initContainers", []) if c.get("name") == "preflight"), {})
resources = preflight.get("resources") or {"requests": {"cpu": "250m", "memory": "512Mi"},
                                           "limits": {"cpu": "1", "memory": "1Gi"}}
env = [e for e in head.get("env", []) if e.get("name", "").startswith("SC_APP_")]
hmac = next((e for e in env if e["name"] == "SC_APP_CHECKPOINT_HMAC_KEY"), None)
ref = ((hmac or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
ring_mount = next((m for m in head.get("volumeMounts", []) if m.get("name") == "hmac-keys"), None)
ring_volume = next((v for v in tmpl.get("volumes", []) if v.get("name") == "hmac-keys"), None)
ring = (ring_mount and ring_volume) or None
sc = dict(tmpl.get("securityContext") or {})
pod_sc = {"runAsNonRoot": True, "runAsUser": sc.get("runAsUser", 10001), "runAsGroup": sc.get("runAsGroup", 10001),
          "fsGroup": sc.get("fsGroup", 10001), "seccompProfile": {"type": "RuntimeDefault"}}
pod = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": pod_name, "labels": {"app.kubernetes.io/component": "ckpt-debug",
                                              "sc-app/rayjob": job_name}},
    "spec": {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": pod_sc,
        "imagePullSecrets": tmpl.get("imagePullSecrets", []),
        "containers": [{
            "name": "ckpt-debug", "image": head["image"], "command": ["sleep", "86400"],
            "env": env, "resources": resources,
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumeMounts": [{"name": "checkpoints", "mountPath": mount}] + ([ring_mount] if ring else []),
        }],
        "volumes": [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": claim}}]
                   + ([ring_volume] if ring else []),
    },
}
if export_claim:
    if export_claim == claim:
        sys.exit(f"EXPORT_CLAIM {export_claim} is the checkpoint claim: its root is checkpoint.dir, where sc-app "
                 "export refuses to write; name a claim of its own (RUNBOOKS section 11)")
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "exports", "mountPath": "/exports"})
    pod["spec"]["volumes"].append({"name": "exports", "persistentVolumeClaim": {"claimName": export_claim}})
print(mount)
secret, key = ref.get("name"), ref.get("key")
if ring:
    keys = ", ".join(i["key"] for i in ring_volume["secret"].get("items", [])) or "all keys"
    ring_secret, ring_path = ring_volume["secret"]["secretName"], ring_mount["mountPath"]
    print(f"HMAC keyring from secret/{ring_secret} ({keys}) at {ring_path}: ckpt verify checks signatures")
else:
    print(f"HMAC key from secret/{secret} (key {key}): ckpt verify checks signatures" if ref
          else "no HMAC key on the RayJob: manifests are hashed, not signed")
print(json.dumps(pod))
'

rayjob=$(kubectl -n "${ns}" get rayjob "${job}" -o json) || { echo "rayjob/${job}: cannot read it in namespace ${ns}" >&2; exit 2; }
built=$(python3 -c "${build_pod}" "${job}" "${pod}" "${export_claim}" <<< "${rayjob}") || exit 2
mount=$(sed -n 1p <<< "${built}")
note=$(sed -n 2p <<< "${built}")
sed -n 3p <<< "${built}" | kubectl -n "${ns}" create -f -
kubectl -n "${ns}" wait --for=condition=Ready "pod/${pod}" --timeout=300s
echo "${note}"
echo "ready: kubectl -n ${ns} exec -it ${pod} -- sc-app ckpt verify --checkpoint-dir ${mount}"
if [[ -n "${export_claim}" ]]; then
  echo "export: kubectl -n ${ns} exec ${pod} -- sc-app export --checkpoint-dir ${mount} --out /exports/<new dir>"
fi
echo "done:  kubectl -n ${ns} delete pod ${pod}"
