"""The job on a Ray cluster whose head offers no CPUs (``ray start --num-cpus=0``: what Ray and KubeRay advise for
large clusters, so that no work lands beside the GCS) and one worker node that has them.

TransferQueue pins its storage units round robin over every alive node, sorted by id: with two units and two nodes
one would be pinned to the head, which can never host it, and the job died at its start with Ray's
``ActorUnschedulableError`` and a traceback. sc-app places the units over the nodes that can host one
(``sc_app.data_plane.tq_placement.unit_nodes``): the run trains and saves. Where no node that has the configured
``data_plane.storage_node_resource`` offers a CPU, the run is refused with one line, exit 2, nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from tests.support.proc import run_args, sc_app

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.support.cluster import add_node, start_cluster  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = start_cluster(num_cpus=0, include_dashboard=False, resources={"head_only": 1})
    try:
        add_node(c, num_cpus=6)
        add_node(c, num_cpus=1, resources={"b": 1})  # the trainer's: its one CPU is the trainer's (a full GPU pod)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def test_the_units_go_where_the_job_leaves_room_and_the_job_runs(cluster: Cluster, tmp_path: Path) -> None:
    """Neither the head (no CPUs) nor node ``b`` (its CPU the trainer's) gets a unit: TransferQueue's round robin
    would have pinned one to one of them (two units, three nodes) and the start failed or waited for ever."""
    ckpt = tmp_path / "ckpt"
    units = ["--set", "data_plane.storage_units=2", "--set", f"ray.address={cluster.address}"]
    units += ["--set", "trainer.resources={b: 1}"]
    done = sc_app(*run_args(ckpt, tmp_path / "trace.jsonl", 2, *units), timeout=300)
    assert done.rc == 0, done.out[-3000:]
    assert "done: step 2" in done.out and "Traceback" not in done.out, done.out[-3000:]
    assert verify_bundle(ckpt / "step_2").ok


def test_no_node_that_can_host_a_unit_is_one_line_and_exit_2(cluster: Cluster, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    only_head = ["--set", "data_plane.storage_node_resource=head_only", "--set", f"ray.address={cluster.address}"]
    done = sc_app(*run_args(ckpt, tmp_path / "trace.jsonl", 2, *only_head), timeout=300)
    assert done.rc == 2, done.out[-3000:]
    errors = [line for line in done.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1 and "Traceback" not in done.out, done.out[-3000:]
    assert "no Ray node can host a TransferQueue storage unit" in errors[0]
    assert "head_only (data_plane.storage_node_resource)" in errors[0], errors[0]
    assert not list(ckpt.glob("step_*"))


def test_a_unit_pinned_to_a_node_whose_cpus_are_taken_ends_the_set_up_at_its_deadline(tmp_path: Path) -> None:
    """No node has a CPU to spare for a unit: the trainer takes the one CPU of node ``b``, the generation worker,
    TransferQueue's controller and the controller actor the head's three. The units then go round robin over both
    nodes, one to ``b``, where it waits for a CPU. TransferQueue's start used to wait for it for ever, whatever
    run.setup_timeout_s said: now the set-up ends at that deadline with one line naming the unit and its node."""
    c = start_cluster(num_cpus=3, include_dashboard=False, resources={"head": 3})
    try:
        add_node(c, num_cpus=1, resources={"b": 1})
        c.wait_for_nodes()
        sets = ["trainer.resources={b: 1}", "generation.resources={head: 1}", "data_plane.storage_units=2"]
        sets += ["run.setup_timeout_s=10", "run.max_in_job_restores=0", f"ray.address={c.address}"]
        args = run_args(tmp_path / "ckpt", tmp_path / "trace.jsonl", 2, *[a for kv in sets for a in ("--set", kv)])
        done = sc_app(*args, timeout=240)
    finally:
        c.shutdown()
    errors = [line for line in done.out.splitlines() if line.startswith("sc-app: error:")]
    assert done.rc == 1 and len(errors) == 1 and "Traceback" not in done.out, done.out[-3000:]
    assert "storage unit(s) #" in errors[0] and "run.setup_timeout_s=10s" in errors[0], errors[0]
