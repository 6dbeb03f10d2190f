"""A node lost mid-run (``ray.cluster_utils.Cluster.remove_node``: its raylet and every worker on it SIGKILLed).

The trainer runs on a node with the custom resource ``trainer_node``; two such nodes exist at first. Losing the
trainer's node while the other one is left is restored in-job (warm): the trainer is started again on the nodes
left and the job rolled back to the newest bundle, exit 0, one attempt — the survivors on the other nodes (the
generation worker, TransferQueue's storage unit) keep their processes. A second run resumes and loses the last
``trainer_node`` node: the cluster no longer fits the job, so the attempt ends at once with exit 1 and one line
naming the actor that has no room and what the live nodes have — the retry path (a new cluster) — and every bundle
still verifies.

The GCS's node health check is shortened (0.5 s x 4) so the test does not wait Ray's default ~15 s to learn a
node is gone; the restore waits for that verdict whatever its length (``sc_app.attempt.cluster_job.NODE_DEATH_WAIT_S``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sc_app.observe.reader import read_history
from tests.support.cli import InProcess
from tests.support.proc import finish, placed_run_args, read_trace, start_logged, wait_for

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.support.cluster import add_node, start_cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = start_cluster(
        num_cpus=8,
        include_dashboard=False,
        _system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 4},
    )
    try:
        for _ in range(2):
            add_node(c, num_cpus=2, resources={"trainer_node": 4})
        add_node(c, num_cpus=3, resources={"gen_node": 4, "tq_node": 4})
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def args(c: Cluster, ckpt: Path, trace: Path, max_steps: int) -> list[str]:
    return placed_run_args(c.address, ckpt, trace, max_steps)


def trainer_node(c: Cluster) -> Any:
    """The cluster node whose raylet started the running trainer worker."""
    raylets = {n.all_processes["raylet"][0].process.pid: n for n in c.worker_nodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"ray::TrainerWorker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in raylets:
            return raylets[parent]
    raise AssertionError("no trainer worker of this cluster is running")


def pids_of(c: Cluster, actor_class: str) -> set[int]:
    """PIDs of this cluster's processes running an actor of ``actor_class`` (children of its nodes' raylets: other
    Ray sessions on the machine are not counted)."""
    raylets = {n.all_processes["raylet"][0].process.pid for n in [c.head_node, *c.worker_nodes]}
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"ray::{actor_class}".encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent in raylets:
            out.add(int(pid))
    return out


SURVIVORS = ("GenerationWorker", "SimpleStorageUnit")  # placed on gen_node / tq_node, never on a trainer_node


def trains(trace: Path) -> int:
    return sum(e["ev"] == "train" for e in read_trace(trace))


def test_a_lost_node_is_restored_in_job_while_the_rest_fits_then_ends_the_attempt(
    cli: InProcess, cluster: Cluster, tmp_path: Path
) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    proc = start_logged(*args(cluster, ckpt, trace, 8), log=tmp_path / "run1.log")
    try:
        wait_for(lambda: trains(trace) >= 3, 600, "3 steps", proc)
        survivors = {actor: pids_of(cluster, actor) for actor in SURVIVORS}
        cluster.remove_node(trainer_node(cluster), allow_graceful=False)
        wait_for(lambda: trains(trace) >= 5, 600, "2 more steps after the node was lost", proc)
        kept = {actor: pids_of(cluster, actor) for actor in SURVIVORS}
        first = finish(proc, 600, "run 1 with its trainer's node lost")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    out = (tmp_path / "run1.log").read_text()
    assert first.rc == 0, out[-4000:]
    assert "done: step 8" in out and "fault node: recovered" in out, out[-3000:]
    (fault,) = read_history(ckpt / "logs").events_named("fault")
    assert fault.data["fault"] == "node" and "their node is gone" in fault.data["error"]
    starts = [e for e in read_trace(trace) if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0, fault.data["restored_step"]], "rebuilt in-job from the bundle"
    assert fault.data["path"] == "warm" and "trainer rank 0" in fault.data["restarted"], fault.data
    assert not [r for r in fault.data["restarted"] if r.startswith(("generation", "TransferQueue"))], fault.data
    assert kept == survivors and all(survivors.values()), f"the other nodes' actors kept: {survivors} -> {kept}"

    before = trains(trace)
    proc = start_logged(*args(cluster, ckpt, trace, 14), log=tmp_path / "run2.log")
    try:
        wait_for(lambda: trains(trace) >= before + 2, 600, "2 steps of the resumed run", proc)
        cluster.remove_node(trainer_node(cluster), allow_graceful=False)  # the last node with trainer_node
        second = finish(proc, 600, "run 2 with the last trainer node lost")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    out = (tmp_path / "run2.log").read_text()
    assert second.rc == 1, out[-4000:]
    errors = [line for line in out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1 and "Traceback" not in out, out[-3000:]
    unfit = r"no longer fits the job: no node has room for trainer rank 0 \(CPU=1, trainer_node=1\)"
    assert re.search(unfit, errors[0]), errors[0]
    assert "live nodes: CPU=3, gen_node=4, tq_node=4; CPU=8)" in errors[0], errors[0]
    assert "a retry on a new cluster resumes from the newest complete bundle" in errors[0]
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0, verify.out
