"""``sc-app k8s suspend/resume/status`` on a job queued by Kueue, and suspend/status edge cases (issue 27 part 3,
issue 31 class H).

Stand-ins: ``FakeApiServer`` with KubeRay's suspension (``kuberay_suspends``) and ``KueueSim``, which behaves like
Kueue's job reconciler (it unsuspends a suspended job whose Workload is still admitted).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sc_app.k8s.cli import main
from tests.k8s.fake_apiserver import FakeApiServer, write_kubeconfig
from tests.k8s.kueue_sim import KueueSim

JOB = "demo-sc-app"
CLUSTER = f"{JOB}-abcde"
RELEASE_LABELS = {"app.kubernetes.io/name": "sc-app", "app.kubernetes.io/instance": "demo"}
FAST = ["--timeout", "20", "--poll", "0.02"]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakeApiServer, str]]:
    server = FakeApiServer(kuberay_suspends=True)
    url = server.start()
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(str(kubeconfig), url)
    yield server, str(kubeconfig)
    server.stop()


def run(kubeconfig: str, *argv: str) -> int:
    return main(["k8s", argv[0], "demo", "-n", "ml", "--kubeconfig", kubeconfig, *argv[1:]])


def template(role: str) -> dict:
    return {"metadata": {"labels": {**RELEASE_LABELS, "sc-app/role": role}}}


def seed(server: FakeApiServer, *, queue: str | None = "ml-gpu", deployment: str = "Running",
         cluster: str = CLUSTER) -> dict:
    labels = {"app.kubernetes.io/instance": "demo"} | ({"kueue.x-k8s.io/queue-name": queue} if queue else {})
    job = server.add("rayjobs", {
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": JOB, "labels": labels},
        "spec": {"suspend": False, "backoffLimit": 5, "rayClusterSpec": {
            "headGroupSpec": {"template": template("head")},
            "workerGroupSpecs": [{"groupName": "gpu", "template": template("worker")}]}},
        "status": {"jobDeploymentStatus": deployment, "rayClusterName": cluster, "failed": 0}})
    for pod in ("head-x1", "gpu-w1"):
        server.add("pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{CLUSTER}-{pod}", "labels": {**RELEASE_LABELS, "ray.io/cluster": CLUSTER}}})
    return job


def ticks(server: FakeApiServer, kubeconfig: str, n: int = 5) -> None:
    """Let the stand-in controllers act: each API request is one reconcile round."""
    for _ in range(n):
        run(kubeconfig, "status", "--no-live")


def rayjob_patches(server: FakeApiServer) -> list[str]:
    return [path for method, path, _ in server.requests if method == "PATCH" and "/rayjobs/" in path]


def test_the_kueue_stand_in_undoes_a_plain_suspend(api) -> None:
    """What the fix is for: a merge patch of spec.suspend alone is reverted while the Workload stays admitted."""
    server, kc = api
    kueue = KueueSim().install(server)
    job = seed(server)
    ticks(server, kc, 2)
    from sc_app.k8s.api import Kube, load_client
    from sc_app.k8s.rayjob import RayJobs
    RayJobs(Kube(load_client(kc), "ml")).set_suspend(JOB, True)
    ticks(server, kc, 3)
    assert job["spec"]["suspend"] is False
    assert f"rayjob/{JOB}: Job admitted, unsuspending" in kueue.events


def test_suspend_deactivates_the_workload_and_the_job_stays_suspended(api, capsys) -> None:
    server, kc = api
    kueue = KueueSim().install(server)
    job = seed(server)
    ticks(server, kc, 2)
    assert run(kc, "suspend", "--wait", *FAST) == 0
    out = capsys.readouterr().out
    (wl,) = [o for (p, _, _), o in server.store.items() if p == "workloads"]
    assert wl["spec"]["active"] is False
    assert f"workload {wl['metadata']['name']} deactivated" in out and "every pod gone" in out
    assert not [k for k in server.store if k[0] == "pods"]
    ticks(server, kc, 10)
    assert job["spec"]["suspend"] is True and job["status"]["jobDeploymentStatus"] == "Suspended"
    assert not any("unsuspending" in e for e in kueue.events)
    assert run(kc, "status", "--no-live") == 0
    status = capsys.readouterr().out
    assert "inactive (deactivated" in status and "evicted: Deactivated" in status
    assert "pods of the job: none left" in status


def test_resume_reactivates_the_workload_and_kueue_unsuspends(api, capsys) -> None:
    server, kc = api
    kueue = KueueSim().install(server)
    job = seed(server)
    ticks(server, kc, 2)
    assert run(kc, "suspend", "--wait", *FAST) == 0
    before = len(rayjob_patches(server))
    assert run(kc, "resume", *FAST) == 0
    assert "Kueue unsuspends the job when queue ml-gpu admits it" in capsys.readouterr().out
    assert len(rayjob_patches(server)) == before, "resume must not write spec.suspend past Kueue's admission"
    ticks(server, kc, 3)
    assert job["spec"]["suspend"] is False and job["status"]["jobDeploymentStatus"] == "Initializing"
    assert kueue.events[-1] == f"rayjob/{JOB}: Job admitted, unsuspending"


def test_no_quota_means_resume_waits_in_the_queue(api, capsys) -> None:
    server, kc = api
    kueue = KueueSim().install(server)
    job = seed(server)
    ticks(server, kc, 2)
    assert run(kc, "suspend", "--wait", *FAST) == 0
    kueue.quota = False
    assert run(kc, "resume", *FAST) == 0
    ticks(server, kc, 5)
    assert job["spec"]["suspend"] is True
    assert run(kc, "status", "--no-live") == 0
    assert "active, waiting for quota" in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["suspend", "resume"])
def test_a_queue_label_without_kueue_is_one_line_and_writes_nothing(api, capsys, verb) -> None:
    server, kc = api
    seed(server, deployment="Suspended" if verb == "resume" else "Running")
    assert run(kc, verb, *FAST) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "kueue.x-k8s.io/queue-name" in err and "install Kueue" in err, err
    assert not rayjob_patches(server)


def test_a_queued_job_without_its_workload_yet_is_transient_and_writes_nothing(api, capsys) -> None:
    server, kc = api
    server.extra_groups.update({"kueue.x-k8s.io/v1beta1": {"workloads": ("Workload", True)}})
    seed(server)
    assert run(kc, "suspend", *FAST) == 1
    assert "no Kueue Workload owned by it exists" in capsys.readouterr().err
    assert not rayjob_patches(server)


@pytest.mark.parametrize("deployment", ["Complete", "Failed", "ValidationFailed"])
def test_suspend_of_a_finished_job_is_refused_at_once(api, capsys, deployment) -> None:
    server, kc = api
    job = seed(server, queue=None, deployment=deployment)
    started = time.monotonic()
    assert run(kc, "suspend", "--wait", "--timeout", "30") == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"is {deployment}: nothing runs to suspend" in err[0] and "nothing written" in err[0]
    assert job["spec"]["suspend"] is False and not rayjob_patches(server)


def test_suspend_wait_finds_the_pods_by_the_jobs_labels_without_a_cluster_name(api, capsys) -> None:
    """KubeRay clears status.rayClusterName while the suspended cluster's pods still run their preStop hooks."""
    server, kc = api
    server.terminating_ticks = 8
    seed(server, queue=None, deployment="Suspending", cluster="")
    for pod in (k for k in server.store if k[0] == "pods"):
        server.store[pod]["metadata"]["deletionTimestamp"] = "2026-01-01T02:00:00Z"
    assert run(kc, "status", "--no-live") == 0
    assert "pods of the job still there: 2" in capsys.readouterr().out
    assert run(kc, "suspend", "--wait", *FAST) == 0
    assert "every pod gone" in capsys.readouterr().out
    assert not [k for k in server.store if k[0] == "pods"], "returned while a pod of the job was still terminating"
