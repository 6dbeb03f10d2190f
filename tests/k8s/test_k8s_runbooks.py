"""Runbook commands that need no cluster are marked ``# local-ok`` in ops/RUNBOOKS.md; test_manifest_e2e.py runs
them against the bundles of its local end to end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.k8s.k8s_helpers import REPO_ROOT

RUNBOOK = REPO_ROOT / "ops" / "RUNBOOKS.md"


def local_commands() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^(.*?)#\s*local-ok\s*$", RUNBOOK.read_text(), re.M)]


def test_runbook_has_local_commands() -> None:
    cmds = local_commands()
    assert len(cmds) >= 4, cmds
    assert any(c.startswith("sc-app k8s submit") for c in cmds)
    assert any(c.startswith("sc-app preflight") for c in cmds)


def run_local_commands(ckpt: Path) -> list[str]:
    """Run every ``# local-ok`` runbook line with CKPT=ckpt; returns their outputs. Used by the local end to end
    (test_manifest_e2e.py), which has real bundles for ``ckpt verify``/``preflight`` to look at."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "NS": "ml",
        "RELEASE": "grpo",
        "JOB": "grpo-sc-app",
        "CKPT": str(ckpt),
    }
    outputs = []
    for cmd in local_commands():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        outputs.append(proc.stdout)
    return outputs


# ---------------------------------------------------------------------------------------------- kubectl logs -l
SELECTOR_LOGS = re.compile(r"kubectl\b[^\n|;&#]*?\blogs\b[^\n|;&#]*?(?:\s-l\b|\s-l\S|--selector\b)[^\n|;&#]*")


def selector_logs_without_tail(paths: list[Path]) -> list[str]:
    """``kubectl logs -l/--selector ...`` commands in ``paths`` that do not say ``--tail``: kubectl then prints only
    the last 10 lines of each pod (its default for a selector), which cuts preflight's JSON."""
    found = []
    for path in paths:
        text = path.read_text(errors="replace").replace("\\\n", " ")
        for m in SELECTOR_LOGS.finditer(text):
            if "--tail" not in m.group(0):
                found.append(f"{path.relative_to(REPO_ROOT)}: {m.group(0).strip()}")
    return found


def _tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return [REPO_ROOT / p for p in out.stdout.split()]


def test_selector_pattern_catches_what_it_must() -> None:
    sample = REPO_ROOT / "ops" / "RUNBOOKS.md"
    assert SELECTOR_LOGS.search('kubectl -n "$NS" logs -l "app=x" -c preflight')
    assert SELECTOR_LOGS.search("kubectl logs --selector=app=x -f")
    assert not SELECTOR_LOGS.search("kubectl -n ns logs pod/x -c preflight")
    assert selector_logs_without_tail([sample]) == [], "ops/RUNBOOKS.md itself"


def test_every_kubectl_logs_with_a_selector_says_tail() -> None:
    paths = [p for p in _tracked("*.md", "*.sh", "*.txt", "*.tpl", "*.yaml", "*.py") if not p.is_relative_to(
        REPO_ROOT / "helm") and p.name != "test_k8s_runbooks.py"]
    assert len(paths) > 10
    assert selector_logs_without_tail(paths) == []


def test_every_kubectl_logs_with_a_selector_in_the_chart_says_tail() -> None:
    assert selector_logs_without_tail(_tracked("helm")) == []


# ---------------------------------------------------------------------------------------------- ops scripts
# A stand-in for kubectl, helm and sc-app (one program, dispatched on its name): answers from files in $FAKE_STATE and
# records every call in calls.jsonl. Unit tests of the scripts' own logic; only a cluster proves the rest.
FAKE_TOOL = r'''#!PYTHON
import json, os, sys
from pathlib import Path

state = Path(os.environ["FAKE_STATE"])
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
stdin = sys.stdin.read() if "-f" in args and "-" in args else ""
with open(state / "calls.jsonl", "a") as log:
    log.write(json.dumps({"tool": tool, "args": args, "stdin": stdin}) + "\n")
scenario = json.loads((state / "scenario.json").read_text())
phase = int((state / "phase").read_text()) if (state / "phase").exists() else 0

def words(*wanted):
    return all(w in args for w in wanted)

if tool == "kubectl":
    if words("get", "rayjob"):
        if not (state / "rayjob.json").exists():
            sys.exit('Error from server (NotFound): rayjobs.ray.io "x" not found')
        print((state / "rayjob.json").read_text())
    elif words("create", "-f"):
        (state / "created.json").write_text(stdin)
        print("pod/" + json.loads(stdin)["metadata"]["name"] + " created")
    elif words("exec", "test", "-d"):  # the head pod the last status named must exist, and the bundle on it
        served = int((state / "served").read_text()) if (state / "served").exists() else 1
        docs = scenario["phases"][phase]
        current = docs[min(served - 1, len(docs) - 1)]["headPod"]
        sys.exit(0 if args[args.index("exec") + 1] == current and args[-1] == scenario["bundle_path"] else 1)
    elif words("exec", "printenv"):  # the HMAC key must not be in the head's environment
        sys.exit(0 if scenario.get("hmac_env") else 1)
    elif words("exec", "cat"):  # the saved bundle's manifest
        sig = scenario.get("signature", {"alg": "hmac-sha256-bytes", "key_id": "0123456789abcdef", "value": "v"})
        print(json.dumps({"signature": sig}))
    elif words("exec", "ckpt", "verify"):
        sys.exit(scenario.get("verify_rc", 0))
    elif words("exec", "ray", "status"):
        print(scenario.get("ray_status", "Resources\n 0.0/2000.0 sc_app_trainer\n"))
    elif words("exec", "sh", "-c"):  # the read-only-root probe on the head
        print(scenario.get("root_probe", "touch: cannot touch '/.sc-app-smoke': Read-only file system\ntmp-writable"))
    elif words("delete", "pod"):
        (state / "phase").write_text("1")
        (state / "served").write_text("0")
    elif words("get", "pvc"):
        print(scenario.get("pvc_phase", "Bound"), end="")
elif tool == "sc-app":
    if words("k8s", "status", "--json"):
        served = int((state / "served").read_text()) if (state / "served").exists() else 0
        docs = scenario["phases"][phase]
        (state / "served").write_text(str(served + 1))
        print(json.dumps(docs[min(served, len(docs) - 1)]))
    elif words("k8s", "wait"):
        sys.exit(scenario.get("wait_rc", 0))
'''


def fake_tools(tmp_path: Path, rayjob: dict | None, scenario: dict | None = None) -> dict[str, str]:
    """A PATH with fake kubectl/helm/sc-app in front and its state dir; returns the environment to run a script."""
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name in ("kubectl", "helm", "sc-app"):
        tool = bin_dir / name
        tool.write_text(FAKE_TOOL.replace("PYTHON", sys.executable, 1))
        tool.chmod(0o755)
    if rayjob is not None:
        (state / "rayjob.json").write_text(json.dumps(rayjob))
    (state / "scenario.json").write_text(json.dumps(scenario or {"phases": [[{}]]}))
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "FAKE_STATE": str(state)}


def calls(env: dict[str, str]) -> list[dict]:
    path = Path(env["FAKE_STATE"]) / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _rayjob(extra: dict | None = None) -> dict:
    from tests.k8s.k8s_helpers import by_kind, load_values, objects, render

    values = load_values(REPO_ROOT / "helm" / "sc-app" / "ci" / "cpu-values.yaml")
    values["checkpoint"]["mountPath"] = "/data/ckpt"  # not the default: nothing may assume /checkpoints
    values["imagePullSecrets"] = [{"name": "regcred"}]
    for key, value in (extra or {}).items():
        values.setdefault(key, {}).update(value)
    (job,) = by_kind(objects(render(values)), "RayJob")
    return job


def restricted_violations(pod: dict) -> list[str]:
    """What the "restricted" Pod Security Standard (Kubernetes 1.31) refuses in ``pod``."""
    spec, problems = pod["spec"], []
    psc = spec.get("securityContext") or {}
    for c in spec["containers"] + spec.get("initContainers", []):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{c['name']}: allowPrivilegeEscalation must be false")
        if (sc.get("capabilities") or {}).get("drop") != ["ALL"] or (sc.get("capabilities") or {}).get("add"):
            problems.append(f"{c['name']}: capabilities must drop ALL and add nothing")
        if not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
            problems.append(f"{c['name']}: runAsNonRoot must be true")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{c['name']}: seccompProfile must be RuntimeDefault or Localhost")
        if sc.get("privileged") or sc.get("runAsUser") == 0 or psc.get("runAsUser") == 0:
            problems.append(f"{c['name']}: privileged or root")
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
               "secret"}
    problems += [f"volume {v['name']}: type not allowed" for v in spec.get("volumes", []) if not set(v) - {"name"}
                 <= allowed]
    problems += [f"spec.{k} not allowed" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    return problems


def test_ckpt_shell_pod_is_admitted_and_verifies_signatures(tmp_path: Path) -> None:
    from sc_app.checkpoint.manifest import HMAC_ENV, HMAC_FILE_ENV
    from tests.k8s.k8s_helpers import validate_core_object

    rayjob = _rayjob({"checkpoint": {"hmac": {"existingSecret": "ckpt-hmac", "secretKey": "key"}}})
    env = fake_tools(tmp_path, rayjob)
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "ckpt-shell.sh"), "ml", "demo-sc-app"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pod = json.loads((Path(env["FAKE_STATE"]) / "created.json").read_text())
    validate_core_object(pod)  # strict: a field the API server would reject fails here
    assert restricted_violations(pod) == []
    tmpl = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (container,) = pod["spec"]["containers"]
    # The HMAC keyring the job's containers get, the same Secret volume at the same path (the path in SC_APP_*
    # env): `ckpt verify` checks signatures there, and no key is in the pod's environment.
    assert next(e for e in container["env"] if e["name"] == HMAC_FILE_ENV)["value"] == "/etc/sc-app-hmac"
    assert not [e for e in container["env"] if e["name"] == HMAC_ENV]
    job_ring = next(v for v in tmpl["volumes"] if v["name"] == "hmac-keys")
    assert job_ring["secret"]["secretName"] == "ckpt-hmac" and job_ring in pod["spec"]["volumes"]
    assert {"name": "hmac-keys", "mountPath": "/etc/sc-app-hmac", "readOnly": True} in container["volumeMounts"]
    assert "HMAC keyring from secret/ckpt-hmac (key) at /etc/sc-app-hmac" in proc.stdout, proc.stdout
    # Requests and limits for cpu and memory (a namespace with a ResourceQuota refuses pods without them).
    for part in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][part]), container["resources"]
    assert container["resources"] == tmpl["initContainers"][0]["resources"]
    # Where and what: the job's own mount path, claim, image and pull secret.
    assert container["volumeMounts"][0] == {"name": "checkpoints", "mountPath": "/data/ckpt"}
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "demo-sc-app-ckpt"
    assert container["image"] == tmpl["containers"][0]["image"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert "sc-app ckpt verify --checkpoint-dir /data/ckpt" in proc.stdout


def test_ckpt_shell_without_a_key_says_so_and_a_missing_job_is_an_error(tmp_path: Path) -> None:
    env = fake_tools(tmp_path, _rayjob())
    script = str(REPO_ROOT / "ops" / "ckpt-shell.sh")
    proc = subprocess.run(["bash", script, "ml", "demo-sc-app"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "manifests are hashed, not signed" in proc.stdout
    pod = json.loads((Path(env["FAKE_STATE"]) / "created.json").read_text())
    assert not [e for e in pod["spec"]["containers"][0]["env"] if "HMAC" in e["name"]]
    (Path(env["FAKE_STATE"]) / "rayjob.json").unlink()
    proc = subprocess.run(["bash", script, "ml", "nope"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "rayjob/nope: cannot read it in namespace ml" in proc.stderr


def _status(head: str, *, live: dict | None = None, retries: int = 0, state: str = "Running") -> dict:
    return {"jobDeploymentStatus": state, "retriesUsed": retries, "headPod": head, "live": live,
            "liveError": None if live else "no running attempt to ask"}


SAVED_4 = {"newestBundleSource": "saved", "newestBundleStep": 4, "freshStart": False, "resumedFromStep": None}


@pytest.mark.parametrize(
    ("after_loss", "rc", "expected"),
    [
        ([_status("h-a", live=SAVED_4), _status("h-b"),
          _status("h-b", live={"resumedFromStep": 4, "freshStart": False, "newestBundleSource": "resumed"})],
         0, "new head h-b resumed from step 4 (absorbed without a KubeRay retry)"),
        ([_status("", retries=1, state="Retrying"),
          _status("h-c", retries=1, live={"resumedFromStep": 6, "freshStart": False, "newestBundleSource": "saved"})],
         0, "new head h-c resumed from step 6 (KubeRay retry 1)"),
        ([_status("h-b", live={"resumedFromStep": None, "freshStart": True, "newestBundleSource": None})],
         1, "FAIL: the new driver on h-b started fresh although step_4 was published"),
        ([_status("h-b", live={"resumedFromStep": 2, "freshStart": False, "newestBundleSource": "resumed"})],
         1, "FAIL: the new driver resumed from step 2, older than step_4"),
        ([_status("h-a", live=SAVED_4)], 1, "FAIL: no new head resumed from a bundle within 40s"),
    ],
    ids=["head-loss-absorbed", "kuberay-retry", "fresh-start", "older-bundle", "never-resumed"],
)
def test_cluster_smoke_requires_a_resume_by_a_new_head(tmp_path: Path, after_loss, rc, expected) -> None:
    scenario = {
        "bundle_path": "/data/ckpt/step_4",  # the RayJob's mount path, not /checkpoints
        "phases": [[_status("h-a"), _status("h-a", live=SAVED_4)], after_loss],
    }
    # A case that waits out the deadline sleeps between probes as on a cluster; with no sleep it would start some
    # hundreds of fake-tool interpreters in its 40 s, the CPU the suite's other worker needs.
    poll = "1" if "within" in expected else "0"
    env = fake_tools(tmp_path, _rayjob(), scenario) | {"SMOKE_POLL_S": poll, "SMOKE_TIMEOUT_S": "40"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "cluster-smoke.sh"), "ml"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == rc, proc.stderr
    assert expected in proc.stderr, proc.stderr
    done = calls(env)
    exec_paths = [c["args"][-1] for c in done if "exec" in c["args"] and "test" in c["args"]]
    assert exec_paths and set(exec_paths) == {"/data/ckpt/step_4"}
    probes = [c["args"] for c in done if "exec" in c["args"] and "sh" in c["args"]]
    assert len(probes) == 1 and probes[0][probes[0].index("exec") + 1] == "h-a", probes  # the training head
    assert "head h-a: root read-only, /tmp writable" in proc.stderr
    first_delete = next(c for c in done if "delete" in c["args"])["args"]
    assert [a for a in first_delete if a in ("delete", "pod", "h-a")] == ["delete", "pod", "h-a"]
    # Cleanup: the RayJob first (waiting for its finalizer), then the rest of the release.
    order = [(c["tool"], c["args"][c["args"].index("delete") + 1] if "delete" in c["args"] else c["args"][0])
             for c in done if ("delete" in c["args"] and "rayjob" in c["args"]) or c["args"][:1] == ["uninstall"]]
    assert order == [("kubectl", "rayjob"), ("helm", "uninstall")], order


@pytest.mark.parametrize(("scenario_extra", "phase0", "expected"), [
    ({"pvc_phase": "Pending"}, [_status("h-a")], "FAIL: pvc/demo-sc-app-ckpt not Bound"),
    ({}, [_status("h-a") | {"reason": "JobStatusCheckTimeoutExceeded", "jobDeploymentStatus": "Failed"}],
     "FAIL: KubeRay ended the job with JobStatusCheckTimeoutExceeded (not retried)"),
    ({}, [_status("h-a") | {"liveError": "the API server's proxy cannot reach the head: networkpolicy/x-ray admits"}],
     "FAIL: live status blocked: the API server's proxy cannot reach the head: networkpolicy/x-ray"),
], ids=["claim-never-binds", "status-check-timeout", "policy-blocks-proxy"])
def test_cluster_smoke_fails_on_what_only_a_live_cluster_shows(tmp_path: Path, scenario_extra, phase0,
                                                              expected) -> None:
    scenario = {"bundle_path": "/data/ckpt/step_4", "phases": [phase0, phase0], **scenario_extra}
    env = fake_tools(tmp_path, _rayjob(), scenario) | {"SMOKE_POLL_S": "0", "SMOKE_TIMEOUT_S": "3"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "cluster-smoke.sh"), "ml"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr
    assert not [c for c in calls(env) if "delete" in c["args"] and "pod" in c["args"]], "nothing was preempted"


def test_cluster_smoke_suspends_and_resumes_after_the_resume_check(tmp_path: Path) -> None:
    scenario = {"bundle_path": "/data/ckpt/step_4",
                "phases": [[_status("h-a"), _status("h-a", live=SAVED_4)],
                           [_status("h-b", live={"resumedFromStep": 4, "freshStart": False})]]}
    env = fake_tools(tmp_path, _rayjob(), scenario) | {"SMOKE_POLL_S": "0", "SMOKE_TIMEOUT_S": "40"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "cluster-smoke.sh"), "ml"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    verbs = [c["args"][1] for c in calls(env) if c["tool"] == "sc-app" and c["args"][:1] == ["k8s"]]
    tail = [v for v in verbs if v != "status"]
    assert tail == ["suspend", "resume", "wait"], verbs
    (suspend,) = [c for c in calls(env) if c["args"][:2] == ["k8s", "suspend"]]
    assert "--wait" in suspend["args"]


def test_cluster_smoke_fails_when_the_head_root_is_writable(tmp_path: Path) -> None:
    """The chart's default read-only root, as the container runtime gives it, is checked on the training head
    before the preemption: a root that takes a write fails the smoke (and nothing is preempted)."""
    phase0 = [_status("h-a"), _status("h-a", live=SAVED_4)]
    scenario = {"bundle_path": "/data/ckpt/step_4", "phases": [phase0, phase0], "root_probe": "tmp-writable"}
    env = fake_tools(tmp_path, _rayjob(), scenario) | {"SMOKE_POLL_S": "0", "SMOKE_TIMEOUT_S": "30"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "cluster-smoke.sh"), "ml"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "FAIL: head h-a: expected a read-only root with a writable /tmp, got: tmp-writable" in proc.stderr
    assert not [c for c in calls(env) if "delete" in c["args"] and "pod" in c["args"]], "nothing was preempted"


def _ring_and_roles_rayjob() -> dict:
    job = _rayjob({"checkpoint": {"hmac": {"existingSecret": "ckpt-hmac"}}})
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"] = [{"groupName": "t", "resources": {"sc_app_trainer": "1000"}}]
    return job


@pytest.mark.parametrize(("extra", "rc", "expected"), [
    ({}, 0, "step_4 signed by key id 0123456789abcdef; verified with the mounted keyring; no key in the head's "
            "environment"),
    ({"hmac_env": True}, 1, "FAIL: head h-a: the HMAC key is in the environment (SC_APP_CHECKPOINT_HMAC_KEY)"),
    ({"signature": {"alg": "hmac-sha256-bytes", "value": "v"}}, 1,
     "FAIL: step_4 is not signed with a key id although checkpoint.hmac is set"),
    ({"verify_rc": 2}, 1, "FAIL: sc-app ckpt verify with the mounted keyring failed on h-a"),
    ({"ray_status": "Resources\n 0.0/4.0 CPU\n"}, 1,
     "FAIL: Ray does not advertise sc_app_trainer (workerGroups[].roles)"),
], ids=["ok", "key-in-env", "no-key-id", "verify-fails", "role-not-advertised"])  # fmt: skip
def test_cluster_smoke_checks_the_keyring_and_the_roles_on_the_live_head(tmp_path: Path, extra, rc, expected) -> None:
    phase0 = [_status("h-a"), _status("h-a", live=SAVED_4)]
    after = [_status("h-b", live={"resumedFromStep": 4, "freshStart": False})]
    scenario = {"bundle_path": "/data/ckpt/step_4", "phases": [phase0, after], **extra}
    env = fake_tools(tmp_path, _ring_and_roles_rayjob(), scenario) | {"SMOKE_POLL_S": "0", "SMOKE_TIMEOUT_S": "30"}
    proc = subprocess.run(["bash", str(REPO_ROOT / "ops" / "cluster-smoke.sh"), "ml"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == rc and expected in proc.stderr, proc.stderr
    if rc == 0:
        assert "Ray advertises the roles' resources: sc_app_trainer" in proc.stderr
        cats = [c["args"][-1] for c in calls(env) if "exec" in c["args"] and "cat" in c["args"]]
        assert cats == ["/data/ckpt/step_4/manifest.json"]
    else:
        assert not [c for c in calls(env) if "delete" in c["args"] and "pod" in c["args"]], "nothing was preempted"
