"""Preemption the way the kubelet does it: the rendered preStop hook, then SIGTERM to PID 1, SIGKILL at the grace.

The rendered RayJob runs on pod stand-ins (``podsim``/``kuberay_sim``): the head and a CPU worker run KubeRay's
``bash -c '... ray start ... --block'`` as PID 1 of their own PID namespace, the head's preflight init container runs
first, the K8sJobMode submitter submits the rendered entrypoint; the trainer and the TransferQueue storage unit sit
on the worker. The checkpoint PVC is one host directory mounted in every pod. Mid-training a pod is stopped like a
kubelet stops it (``RayJobSim.stop``: the rendered ``preStop`` exec — ``sc-app stop --checkpoint-dir ... --wait`` —
to completion, SIGTERM to PID 1, SIGKILL when ``terminationGracePeriodSeconds`` ends):

* the head (its driver is a job subprocess far from PID 1, which SIGTERM alone never reaches): a bundle of the step
  reached at that moment — not a periodic one, the save period is longer than the run — is published before the
  hook returns, and the retry (a new attempt: new pods, same volume) resumes from it and finishes;
* a worker, while the head stays up (a spot GPU node going): the same bundle, cut before the worker's node goes.

Needs root (network, PID and mount namespaces). What only a live cluster proves: that the kubelet and the node's
shutdown manager give the pod its whole grace period, and KubeRay's retry (``ops/cluster-smoke.sh``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import verify_bundle
from tests.k8s.k8s_helpers import by_kind, objects, render, sim_worker_values
from tests.k8s.kuberay_sim import RayJobSim
from tests.k8s.podsim import Network, Volumes, image_env, missing_tools
from tests.support.proc import read_trace, wait_for

pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
_MISSING = missing_tools()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.pods,
    pytest.mark.timeout(900),
    pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} for pod stand-ins (run as root)"),
]

RELEASE, NS = "ps", "ml"
MAX_STEPS = 40
STOP_AT_STEP = 3  # train at least this far before the pod is stopped
MOUNT = "/checkpoints"


def _values() -> dict[str, Any]:
    values = sim_worker_values()
    values["config"]["run"] = {"max_steps": MAX_STEPS, "trace_file": f"{MOUNT}/trace.jsonl"}
    values["config"]["checkpoint"]["save_period"] = 1000  # no periodic bundle before the end: the stop's is the one
    values["networkPolicy"] = {"enabled": False}
    return values


@pytest.fixture
def attempts(tmp_path: Path) -> Iterator[Any]:
    """``make()`` → a new RayJob attempt (new pods) on the same PVC, as KubeRay's backoffLimit retry creates."""
    objs = objects(render(_values(), name=RELEASE, namespace=NS))
    (rayjob,) = by_kind(objs, "RayJob")
    pvc = tmp_path / "pvc"
    pvc.mkdir()
    volumes = Volumes.of_release(objs, pvc)
    made: list[tuple[Network, RayJobSim]] = []

    def make() -> RayJobSim:
        root = tmp_path / f"attempt{len(made)}"
        root.mkdir()
        net = Network(f"scps{os.getpid() % 100000}{len(made)}", root)
        sim = RayJobSim(rayjob, net, root, volumes, image_env(), NS, cluster=f"{RELEASE}-a{len(made)}")
        made.append((net, sim))
        sim.create_pods()
        return sim

    make.pvc = pvc  # type: ignore[attr-defined]
    try:
        yield make
    finally:
        for net, sim in reversed(made):
            sim.close()
            net.close()


def _start(sim: RayJobSim) -> dict[str, Any]:
    """Head (preflight first), worker, readiness, submit; returns the preflight's decision."""
    init = sim.start_head()
    decision = json.loads(init[0].out)
    sim.start_workers()
    sim.wait_ready()
    sim.submit()
    return decision


def _trained(pvc: Path) -> int:
    return max((e["step"] for e in read_trace(pvc / "trace.jsonl") if e["ev"] == "train"), default=0)


def _bundles(pvc: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in pvc.glob("step_*") if p.name[5:].isdigit())


def _assert_read_only_roots(sim: RayJobSim) -> None:
    """The chart's default: every running container (head, worker, submitter) trains on a read-only root, with
    /tmp and $HOME writable emptyDirs — so the job got this far writing nowhere else."""
    for pod in [sim.head, *sim.workers, sim.submitter]:
        assert pod is not None and pod.running(), f"{pod and pod.name} is not running"
        probe = pod.exec(["/bin/sh", "-c", 'touch /tmp/p /home/scapp/p || exit 3; out=$(touch /p 2>&1); '
                          'case "$out" in *"Read-only file system"*) echo read-only-root ;; *) echo "$out" ;; esac'],
                         timeout=60)
        assert probe.out.strip() == "read-only-root", f"{pod.name}: {probe.out}"


def _stop_mid_training(sim: RayJobSim, pod_kind: str, pvc: Path) -> int:
    """Wait for training, stop the pod like the kubelet, check the bundle of the step reached; returns that step."""
    assert sim.submitter is not None
    wait_for(lambda: _trained(pvc) >= STOP_AT_STEP, 300, f"step {STOP_AT_STEP}", None)
    _assert_read_only_roots(sim)
    pod = sim.head if pod_kind == "head" else sim.workers[0]
    assert pod is not None
    term = sim.stop(pod)
    hook = term.pre_stop
    assert hook is not None, "the rendered pod has no preStop hook"
    assert hook.rc == 0 and "stopped: run" in hook.out, f"preStop hook: rc {hook.rc}\n{hook.out[-3000:]}"
    reached = _trained(pvc)
    assert _bundles(pvc) == [reached], f"expected only the stop's bundle of step {reached}: {_bundles(pvc)}"
    assert reached % 1000 != 0 and reached < MAX_STEPS, "a periodic or final bundle would prove nothing"
    assert verify_bundle(pvc / f"step_{reached}").ok
    lease = json.loads((pvc / "LEASE").read_text())
    assert lease["released"]["outcome"] == "stopped" and lease["released"]["final_step"] == reached, lease
    return reached


def test_head_prestop_publishes_the_reached_step_and_the_retry_resumes_it(attempts: Any) -> None:
    pvc = attempts.pvc
    first = attempts()
    assert _start(first)["decision"] == "fresh"
    reached = _stop_mid_training(first, "head", pvc)  # the driver released the lease as "stopped": exit 143
    first.close()  # the rest of the attempt goes with its RayCluster; KubeRay's retry is a new one

    retry = attempts()
    decision = _start(retry)
    assert decision["decision"] == "resume" and decision["step"] == reached, decision
    assert retry.submitter is not None
    rc = retry.submitter.wait(timeout=600)
    out = retry.submitter.log()
    assert rc == 0, out[-4000:]
    assert f"resuming from {MOUNT}/step_{reached} (step {reached})" in out and f"done: step {MAX_STEPS}" in out, (
        out[-4000:]
    )
    assert _bundles(pvc)[-1] == MAX_STEPS


def test_worker_prestop_publishes_the_reached_step_while_the_head_stays_up(attempts: Any) -> None:
    pvc = attempts.pvc
    sim = attempts()
    assert _start(sim)["decision"] == "fresh"
    _stop_mid_training(sim, "worker", pvc)
    assert sim.head is not None and sim.head.running(), "only the worker's pod went"
