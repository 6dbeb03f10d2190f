"""The command blocks of ops/RUNBOOKS.md, run as written, in order (issue 19, finding 4).

Each test takes one section's ```bash block verbatim and runs it with ``bash -euo pipefail`` and:
- the real ``sc-app`` (its ``k8s`` verbs against the API-server stand-in, fake_apiserver.py, with KubeRay's
  suspension and finalizer; its ``ckpt``/``preflight`` verbs on a real checkpoint directory of real bundles);
- ``helm``: standins/helm.py, which renders with the real Helm engine and writes the objects to the stand-in;
- ``kubectl``: standins/kubectl.py (``exec`` runs the command here, on the checkpoint directory ``$CKPT``);
- ``jq`` and ``ops/ckpt-shell.sh`` as they are.
What only a live cluster shows (the operator's own timing, a real kubelet's preStop) is in ops/cluster-smoke.sh.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.fake_apiserver import FakeApiServer, write_kubeconfig
from tests.k8s.k8s_helpers import REPO_ROOT, sim_worker_values

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

RUNBOOK = REPO_ROOT / "ops" / "RUNBOOKS.md"
NS, RELEASE, JOB = "ml", "grpo", "grpo-sc-app"
CLUSTER = f"{JOB}-x1"


def section_blocks(number: int) -> list[str]:
    """The ```bash blocks of section ``number``, in order."""
    text = RUNBOOK.read_text()
    m = re.search(rf"^## {number}\. .*?$(.*?)(?=^## \d+\. |\Z)", text, re.M | re.S)
    assert m, f"no section {number}"
    return re.findall(r"```bash\n(.*?)```", m.group(1), re.S)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The API-server stand-in (KubeRay suspends), PATH with the stand-ins, a checkpoint dir with bundles 2, 4, 6."""
    from tests.support.bundles import make_bundle

    server = FakeApiServer(kuberay_suspends=True)
    url = server.start()
    kubeconfig, bin_dir, state, ckpt, work = (tmp_path / n for n in ("kubeconfig", "bin", "state", "ckpt", "work"))
    write_kubeconfig(str(kubeconfig), url, namespace=NS)
    for d in (bin_dir, state, ckpt, work):
        d.mkdir()
    for name in ("ops", "helm"):  # the runbooks run from the repository root; files they write land in `work`
        (work / name).symlink_to(REPO_ROOT / name)
    for step in (2, 4, 6):
        make_bundle(ckpt, step)
    for tool, target in (("helm", "tests.k8s.standins.helm"), ("kubectl", "tests.k8s.standins.kubectl"),
                         ("sc-app", "sc_app")):
        path = bin_dir / tool
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {target} "$@"\n')
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "KUBECONFIG": str(kubeconfig),
           "PYTHONPATH": str(REPO_ROOT), "RUNBOOK_STATE": str(state), "NS": NS, "RELEASE": RELEASE, "JOB": JOB,
           "KUBERAY_VERSION": "1.7.0", "CKPT": str(ckpt), "EXPORT_CLAIM": "policies",
           "EXPORTS": str(tmp_path / "exports")}
    (tmp_path / "exports").mkdir()
    env.pop("KUBERNETES_SERVICE_HOST", None)
    yield {"server": server, "env": env, "ckpt": ckpt, "state": state, "tmp": tmp_path, "work": work}
    server.stop()


def bash(world: dict[str, Any], script: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=world["work"], env=world["env"],
                          capture_output=True, text=True, timeout=timeout)


def install_running(world: dict[str, Any]) -> None:
    """``helm install`` of the two-pod release (through the helm stand-in), then what KubeRay does: a running
    attempt with a head and a worker pod."""
    values = world["tmp"] / "my-values.yaml"
    values.write_text(yaml.safe_dump(sim_worker_values()))
    proc = bash(world, f'helm install "$RELEASE" {REPO_ROOT}/helm/sc-app -n "$NS" -f {values}')
    assert proc.returncode == 0, proc.stderr
    server: FakeApiServer = world["server"]
    server.store[("rayjobs", NS, JOB)]["status"] = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING",
                                                   "rayClusterName": CLUSTER, "jobId": f"{JOB}-abc"}
    for role in ("head", "worker"):
        server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{CLUSTER}-{role}", "labels": {"ray.io/cluster": CLUSTER, "ray.io/node-type": role}}}, ns=NS)


def calls(world: dict[str, Any]) -> list[dict[str, Any]]:
    path = world["state"] / "calls.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def job(world: dict[str, Any]) -> dict[str, Any]:
    return world["server"].store[("rayjobs", NS, JOB)]


def ray_pods(world: dict[str, Any]) -> list[str]:
    return [k[2] for k in world["server"].store if k[0] == "pods"]


# ---------------------------------------------------------------------------------------------- suspend --wait
def test_suspend_wait_returns_only_when_kuberay_suspended_and_the_pods_are_gone(world) -> None:
    install_running(world)
    world["server"].terminating_ticks = 8
    started = time.monotonic()
    proc = bash(world, 'sc-app k8s suspend "$RELEASE" -n "$NS" --wait --poll 0.2')
    assert proc.returncode == 0, proc.stderr
    assert job(world)["status"]["jobDeploymentStatus"] == "Suspended" and ray_pods(world) == []
    assert "every pod gone" in proc.stdout and time.monotonic() - started < 60
    # Without --wait it returns at once: the pods (and their stop hooks) are still there.
    install_running(world)
    job(world)["spec"]["suspend"] = False
    proc = bash(world, 'sc-app k8s suspend "$RELEASE" -n "$NS"')
    assert proc.returncode == 0 and "--wait waits" in proc.stdout and ray_pods(world)


def test_suspend_wait_gives_up_at_its_timeout_in_one_line(world) -> None:
    install_running(world)
    world["server"].terminating_ticks = 10**6  # a pod that never finishes terminating
    proc = bash(world, 'sc-app k8s suspend "$RELEASE" -n "$NS" --wait --timeout 1 --poll 0.2')
    assert proc.returncode == 1
    assert re.fullmatch(r"sc-app k8s: error: rayjob/grpo-sc-app not suspended after 1s: 2 pod\(s\) still terminating "
                        r"\(.*\)\n", proc.stderr), proc.stderr


# ---------------------------------------------------------------------------------------------- sections
def test_section_4_corrupt_bundle_on_a_cluster(world) -> None:
    install_running(world)
    (block,) = section_blocks(4)[1:]
    proc = bash(world, block)
    assert proc.returncode == 0, proc.stderr
    assert job(world)["spec"]["suspend"] is False
    (verify,) = [c for c in calls(world) if "exec" in c["args"]]
    assert verify["ray_pods"] == 0, "the debug pod's commands ran only once the job's pods were gone"


def test_section_5_rollback_to_step_k(world) -> None:
    install_running(world)
    (block,) = section_blocks(5)
    proc = bash(world, block)
    assert proc.returncode == 0, proc.stderr
    ckpt: Path = world["ckpt"]
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_2", "step_4"]
    assert [p.name[:7] for p in (ckpt / "quarantine").iterdir() if p.is_dir()] == ["step_6."]
    assert "resume point: step_4; would move step_6" in proc.stdout
    assert '"decision": "resume"' in proc.stdout or "step_4" in proc.stdout
    execs = [c for c in calls(world) if "exec" in c["args"]]
    assert len(execs) == 3 and all(c["ray_pods"] == 0 for c in execs)
    assert job(world)["spec"]["suspend"] is False


def test_rollback_refuses_while_a_writer_holds_the_lease(world) -> None:
    from sc_app.checkpoint.lease import Lease

    lease = Lease.acquire(world["ckpt"], "run-still-stopping")
    try:
        proc = bash(world, 'sc-app ckpt rollback --checkpoint-dir "$CKPT" --to 4')
    finally:
        lease.release("stopped")
    assert proc.returncode == 2
    assert re.fullmatch(r"sc-app: error: run run-still-stopping \(epoch 1, .*\) holds a live lease on .*: it may still "
                        r"publish a bundle after the rollback; stop it first \(`sc-app k8s suspend RELEASE --wait`.*\n",
                        proc.stderr), proc.stderr
    assert sorted(p.name for p in world["ckpt"].glob("step_*")) == ["step_2", "step_4", "step_6"], "nothing moved"
    proc = bash(world, 'sc-app ckpt rollback --checkpoint-dir "$CKPT" --to 5')
    assert proc.returncode == 2 and "no step_5 in" in proc.stderr


def test_section_6_resize_edits_the_whole_list(world) -> None:
    install_running(world)
    (block,) = section_blocks(6)
    proc = bash(world, block)
    assert proc.returncode == 0, proc.stderr
    spec = job(world)["spec"]
    (group,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["groupName"], group["replicas"], group["maxReplicas"]) == ("cpu", 4, 4)
    config = world["server"].store[("configmaps", NS, f"{JOB}-config")]["data"]["config.yaml"]
    assert yaml.safe_load(config)["trainer"]["num_workers"] == 2
    assert spec["suspend"] is False
    # The command the runbook used to give: Helm replaces the list, the chart's schema refuses what is left.
    proc = bash(world, f'helm upgrade "$RELEASE" {REPO_ROOT}/helm/sc-app -n "$NS" --reset-then-reuse-values '
                       "--set 'workerGroups[0].replicas=4'")
    assert proc.returncode == 1 and "UPGRADE FAILED" in proc.stderr and "workerGroups" in proc.stderr


def test_section_7_upgrade_the_image(world) -> None:
    install_running(world)
    (block,) = section_blocks(7)
    proc = bash(world, block)
    assert proc.returncode == 0, proc.stderr
    head = job(world)["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["image"].endswith(":0.1.1")
    assert job(world)["spec"]["suspend"] is False and ray_pods(world) == []


def test_section_8_clean_up_both_ways(world) -> None:
    install_running(world)
    helm_block, sc_app_block = section_blocks(8)
    proc = bash(world, helm_block)
    assert proc.returncode == 0, proc.stderr
    left = {k[0] for k in world["server"].store}
    assert "rayjobs" not in left and "configmaps" not in left and "persistentvolumeclaims" in left
    # The sc-app k8s way, on a release sc-app k8s submitted.
    values = world["tmp"] / "my-values.yaml"
    proc = bash(world, f'sc-app k8s submit "$RELEASE" -n "$NS" -f {values} && {sc_app_block}')
    assert proc.returncode == 0, proc.stderr
    assert not [k for k in world["server"].store if k[0] != "pods"], world["server"].store.keys()


def test_section_11_export_onto_a_claim_through_the_debug_pod(world) -> None:
    """The export runs in ckpt-debug with the job's pods gone, onto the export claim mounted at /exports, never into
    the checkpoint claim. The world's bundles are of the tiny backend, so export verifies step_6, accepts the
    target and then refuses ("nothing to export"): what an hf bundle adds is the export itself
    (tests/e2e/test_hf_run.py exports one)."""
    install_running(world)
    (block,) = section_blocks(11)
    before = sorted(p.name for p in world["ckpt"].iterdir())
    proc = bash(world, block)
    assert proc.returncode == 2, proc.stderr
    assert "step_6 holds a model.backend=tiny policy: there is nothing to export" in proc.stderr, proc.stderr
    assert "inside the checkpoint directory" not in proc.stderr
    (export,) = [c for c in calls(world) if "exec" in c["args"]]
    assert export["ray_pods"] == 0, "exported only once the job's pods were gone"
    out = export["args"][export["args"].index("--out") + 1]
    assert out.startswith(world["env"]["EXPORTS"] + "/policy-")
    pod = json.loads((world["state"] / "created-pod.json").read_text())
    assert {"name": "exports", "persistentVolumeClaim": {"claimName": "policies"}} in pod["spec"]["volumes"]
    assert {"name": "exports", "mountPath": "/exports"} in pod["spec"]["containers"][0]["volumeMounts"]
    assert sorted(p.name for p in world["ckpt"].iterdir()) == before and not any((world["tmp"] / "exports").iterdir())


def test_ckpt_shell_refuses_the_checkpoint_claim_as_export_claim(world) -> None:
    install_running(world)
    proc = bash(world, f'ops/ckpt-shell.sh "$NS" "$JOB" {JOB}-ckpt')
    assert proc.returncode == 2
    assert f"EXPORT_CLAIM {JOB}-ckpt is the checkpoint claim: its root is checkpoint.dir" in proc.stderr, proc.stderr


def operator_install_line() -> str:
    """Section 1's pinned install of the KubeRay operator."""
    (line,) = [ln for ln in section_blocks(1)[0].splitlines() if ln.startswith("helm install kuberay-operator")]
    return line


def test_section_12_operator_timeout(world) -> None:
    (block,) = section_blocks(12)
    install_running(world)
    proc = bash(world, operator_install_line())
    assert proc.returncode == 0, proc.stderr
    job(world)["status"].update(jobDeploymentStatus="Failed", reason="JobStatusCheckTimeoutExceeded")
    proc = bash(world, block)
    assert proc.returncode == 0, proc.stderr
    assert "reason: JobStatusCheckTimeoutExceeded" in proc.stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [
        {"name": "RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS", "value": "1800"}]
    assert json.loads((world["state"] / "chart-kuberay-operator.json").read_text())["version"] == "1.7.0"


def test_every_runbook_section_with_cluster_commands_is_run_here() -> None:
    text = Path(__file__).read_text()
    for number in (4, 5, 6, 7, 8, 10, 11, 12):
        assert section_blocks(number) and f"section_blocks({number})" in text
    assert shutil.which("jq"), "section 6 uses jq"


def test_section_10_the_model_claim_the_loader_writes_is_writable_and_the_chart_mounts_it_read_only() -> None:
    """A ReadOnlyMany claim cannot be written, not even by the loader: the claim section 10 creates and the loader
    pod mounts read-write is ReadWriteMany, it is the claim ci/gpu-hf-values.yaml names, and the chart mounts it
    read-only (and accepts it on a live cluster)."""
    from tests.k8s.k8s_helpers import CHART_DIR, by_kind, load_values, objects, render_live
    from tests.k8s.lookup_apiserver import LookupApiServer

    (block,) = section_blocks(10)
    claim = yaml.safe_load(re.search(r"<<'EOF'\n(.*?)\nEOF\n", block, re.S).group(1))
    overrides = json.loads(re.search(r"--overrides='(.*?)'", block, re.S).group(1))
    (volume,) = overrides["spec"]["volumes"]
    (mount,) = overrides["spec"]["containers"][0]["volumeMounts"]
    assert volume["persistentVolumeClaim"] == {"claimName": claim["metadata"]["name"]} and not mount.get("readOnly")
    assert "ReadWriteMany" in claim["spec"]["accessModes"], "the loader writes it"
    values = load_values(CHART_DIR / "ci" / "gpu-hf-values.yaml")
    assert values["model"]["existingClaim"] == claim["metadata"]["name"]
    server = LookupApiServer([{**claim, "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                               "metadata": {**claim["metadata"], "namespace": NS}}])
    url = server.start()
    try:
        (rayjob,) = by_kind(objects(render_live(url, values, namespace=NS)), "RayJob")
    finally:
        server.stop()
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    model = next(v for v in head["volumes"] if v["name"] == "model")
    assert model["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in head["containers"][0]["volumeMounts"]
