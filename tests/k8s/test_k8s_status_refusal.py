"""A refusing preflight must not hold the GPUs silently (issue 27 part 2, bounded): the chart bounds an attempt with
``job.preRunningDeadlineSeconds`` (900 s by default) and ``sc-app k8s status`` names the refusal while the init
container crash-loops, and KubeRay's ``PreRunningDeadlineExceeded`` after. The API-server stand-in serves the head
pod's status and its init container's log as the kubelet reports them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sc_app.checkpoint.resume import ResumePlan
from sc_app.k8s.cli import main
from tests.k8s.fake_apiserver import FakeApiServer
from tests.k8s.k8s_helpers import BASE_VALUES, REPO_ROOT, by_kind, objects, render

JOB = "demo-sc-app"
CLUSTER = f"{JOB}-abcde"
HEAD = f"{CLUSTER}-head-x1"
REASON = "bundle step_40 was written for dataset sha256:aa.., the config reads sha256:bb..; refusing to resume"


def seed(server: FakeApiServer, *, status: dict, restarts: int = 0, exit_code: int | None = None,
         log: str | None = None) -> None:
    server.add("rayjobs", {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": JOB},
                           "spec": {"backoffLimit": 5, "preRunningDeadlineSeconds": 900}, "status": status})
    init = {"name": "preflight", "restartCount": restarts, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
    if exit_code is not None:
        init["lastState"] = {"terminated": {"exitCode": exit_code, "reason": "Error"}}
    server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": HEAD, "labels": {"ray.io/cluster": CLUSTER, "ray.io/node-type": "head"}},
        "status": {"phase": "Pending", "initContainerStatuses": [init]}})
    if log is not None:
        server.logs[("ml", HEAD, "preflight")] = log


def status(kubeconfig: str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    assert main(["k8s", "status", "demo", "-n", "ml", "--kubeconfig", kubeconfig, "--no-live", *flags]) == 0
    return capsys.readouterr().out


def test_the_chart_bounds_an_attempt_at_900_seconds_by_default() -> None:
    (job,) = by_kind(objects(render(BASE_VALUES)), "RayJob")
    assert job["spec"]["preRunningDeadlineSeconds"] == 900


def test_status_names_a_crash_looping_refusal_and_the_deadline(api, capsys) -> None:
    server, kc = api
    log = json.dumps({**ResumePlan("refuse", REASON).as_dict(), "moved_nothing_because": None}, indent=2)
    running = {"jobDeploymentStatus": "Initializing", "rayClusterName": CLUSTER, "failed": 1}
    seed(server, status=running, restarts=4, exit_code=2, log=log)
    out = status(kc, capsys)
    assert f"preflight refuses to resume (restarted 4 times): {REASON}" in out, out
    assert "preRunningDeadlineSeconds (900 s)" in out and "newest bundle at the last (re)start: none: preflight " \
        "refuses" in out
    doc = json.loads(status(kc, capsys, "--json"))
    assert doc["preflightRefusal"] == REASON


def test_a_refusal_that_is_not_json_shows_its_last_line(api, capsys, tmp_path) -> None:
    """What the real `sc-app preflight` prints (stderr, in the container log) for a checkpoint path that is a file."""
    (tmp_path / "ckpt").write_text("")
    proc = subprocess.run([sys.executable, "-m", "sc_app", "preflight", "--checkpoint-dir", str(tmp_path / "ckpt"),
                           "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    server, kc = api
    seed(server, status={"jobDeploymentStatus": "Initializing", "rayClusterName": CLUSTER}, restarts=2,
         exit_code=proc.returncode, log=proc.stdout + proc.stderr)
    out = status(kc, capsys)
    assert "preflight refuses to resume (restarted 2 times): sc-app: error: checkpoint dir" in out, out


def test_a_healthy_preflight_is_no_refusal(api, capsys) -> None:
    server, kc = api
    log = json.dumps(ResumePlan("fresh", "no bundle yet").as_dict())
    seed(server, status={"jobDeploymentStatus": "Running", "rayClusterName": CLUSTER}, log=log)
    out = status(kc, capsys)
    assert "refuses" not in out and "newest bundle at the last (re)start: none (fresh start)" in out


def test_status_explains_pre_running_deadline_exceeded(api, capsys) -> None:
    server, kc = api
    seed(server, status={"jobDeploymentStatus": "Retrying", "rayClusterName": "", "failed": 2,
                         "reason": "PreRunningDeadlineExceeded",
                         "message": "RayJob did not reach Running within 900 seconds"})
    out = status(kc, capsys)
    assert "reason: PreRunningDeadlineExceeded: an attempt did not reach Running within preRunningDeadlineSeconds " \
        "(900 s; KubeRay retries it" in out, out
    assert "a refusing preflight" in out
