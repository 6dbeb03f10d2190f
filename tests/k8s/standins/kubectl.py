"""A ``kubectl`` stand-in for the runbook sequences, for the verbs the runbooks use: ``get rayjob NAME -o json`` and
``delete rayjob NAME --wait`` (through the API-server stand-in, its finalizer included), ``delete pvc``,
``create -f -`` / ``wait`` / ``delete pod`` for the ckpt-debug pod, ``exec POD -- CMD`` (CMD runs here, on the
checkpoint directory the test gives as ``$CKPT``: what the pod would see on the claim), ``get deploy
kuberay-operator`` (the env the helm stand-in recorded for the operator's chart). Anything else exits 3.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from tests.k8s.standins.common import kube, log_call, namespace, state, unsupported


def _pods_left(ns: str) -> int:
    k = kube(ns)
    return sum("ray.io/node-type" in (p["metadata"].get("labels") or {}) for p in k.list(k.resource("v1", "Pod")))


def main(args: list[str]) -> None:
    ns = namespace(args)
    valued = {"-n", "--namespace", "-o", "--output", "-c", "--container", "-f", "--filename"}
    words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    if "exec" in args:
        cmd = args[args.index("--") + 1:]
        log_call("kubectl", args, ray_pods=_pods_left(ns))
        sys.exit(subprocess.run(cmd).returncode)
    log_call("kubectl", args)
    k = kube(ns)
    if words[:2] == ["get", "rayjob"]:
        name = words[words.index("rayjob") + 1]
        obj = k.get(k.resource("ray.io/v1", "RayJob"), name)
        if obj is None:
            sys.exit(f'Error from server (NotFound): rayjobs.ray.io "{name}" not found')
        print(json.dumps(obj))
    elif "create" in words and "-" in args:
        (state() / "created-pod.json").write_text(sys.stdin.read())  # what the test checks: the debug pod's spec
        print("pod/ckpt-debug created")
    elif "wait" in words:
        print("pod/ckpt-debug condition met")
    elif "delete" in words and "pod" in words:
        print("pod \"ckpt-debug\" deleted")
    elif "delete" in words and ("rayjob" in words or "pvc" in words):
        kind = "rayjob" if "rayjob" in words else "pvc"
        name = words[words.index(kind) + 1]
        res = k.resource("ray.io/v1", "RayJob") if kind == "rayjob" else k.resource("v1", "PersistentVolumeClaim")
        k.delete(res, name)
        deadline = time.monotonic() + 30
        while "--wait" in args and k.get(res, name) is not None:
            if time.monotonic() > deadline:
                sys.exit(f"error: timed out waiting for the condition on {kind}/{name}")
            time.sleep(0.1)
        print(f'{kind} "{name}" deleted')
    elif words[:3] == ["get", "deploy", "kuberay-operator"]:
        chart = json.loads((state() / "chart-kuberay-operator.json").read_text())
        print(json.dumps(chart.get("env", [])))
    else:
        unsupported("kubectl", args)


if __name__ == "__main__":
    main(sys.argv[1:])
