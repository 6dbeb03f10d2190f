"""The same job on a multi-node local Ray cluster (``ray.cluster_utils.Cluster``: head + 2 worker nodes).

Node A carries ``trainer_node``, node B carries ``gen_node`` and ``tq_node``; the head carries neither. The config
puts the trainer workers (two of them: torch.distributed over gloo), the generation worker and TransferQueue's
storage units on those nodes. The CLI runs in a subprocess against the cluster address; while it runs, the test
reads where every actor landed from Ray's state API. A second run resumes from the first run's newest bundle.

The first run has two TransferQueue storage units, the second one: what a job that lost a node for good does (the
retry comes back with fewer units). Checked: the resume is not refused over the unit count, restores exactly the
bundle's rows (its ``start`` trace event against the sidecar), continues the step counter, and every bundle
verifies. The bit-for-bit row check, both directions, is ``tests/integration/data_plane/test_reroute.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import InProcess
from tests.support.proc import finish, free_port, load_sidecar, placed_run_args, sc_app, start_sc_app

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from tests.support.cluster import add_node, start_cluster  # noqa: E402

pytestmark = pytest.mark.slow

NODE_CPUS = 4  # logical CPUs of nodes A and B: room for what the config sends there (B: 2 units), plus one spare
# The head is the biggest node and the driver's own: were the placement config ignored, Ray would pack the actors
# there (local node first), so the placement assertions below would fail.
HEAD_CPUS = 8


@dataclass
class Nodes:
    cluster: Cluster
    address: str
    head: str
    trainer_node: str
    gen_node: str


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    # This process does not join the cluster (it may hold the suite's shared local Ray): the state API is asked
    # through the cluster's address instead.
    # the dashboard (the state API) on a free port: 8265 may be another test's or another suite's
    cluster = start_cluster(num_cpus=HEAD_CPUS, include_dashboard=True, dashboard_port=free_port())
    try:
        a = add_node(cluster, num_cpus=NODE_CPUS, resources={"trainer_node": 4})
        b = add_node(cluster, num_cpus=NODE_CPUS, resources={"gen_node": 4, "tq_node": 4})
        cluster.wait_for_nodes()
        yield Nodes(cluster, cluster.address, cluster.head_node.node_id, a.node_id, b.node_id)
    finally:
        cluster.shutdown()


def cluster_args(n: Nodes, ckpt: Path, trace: Path, max_steps: int, units: int) -> list[str]:
    sets = ("--set", "trainer.num_workers=2", "--set", f"data_plane.storage_units={units}")
    return placed_run_args(n.address, ckpt, trace, max_steps, *sets)


WATCHED = ("TrainerWorker", "GenerationWorker", "SimpleStorageUnit", "SingleControllerActor")


def alive_actors(address: str) -> list[dict[str, Any]]:
    from ray.util.state import list_actors

    actors = list_actors(address, filters=[("state", "=", "ALIVE")], limit=1000, raise_on_missing_output=False)
    return [{"class": a.class_name, "node": a.node_id, "pid": a.pid} for a in actors]


def watch_placement(proc: Any, address: str, timeout: float) -> dict[str, set[str]]:
    """Poll the cluster until every watched actor class is alive (or the run ends); returns class -> node ids."""
    seen: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, set[int]] = defaultdict(set)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for a in alive_actors(address):
            if a["class"] in WATCHED:
                seen[a["class"]].add(a["node"])
                counts[a["class"]].add(a["pid"])
        if all(c in seen for c in WATCHED) and len(counts["TrainerWorker"]) >= 2:
            break
        time.sleep(0.3)
    return dict(seen)


def test_multinode_placement_bundles_and_resume(cli: InProcess, nodes: Nodes, tmp_path: Path) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    proc = start_sc_app(*cluster_args(nodes, ckpt, trace, 4, units=2))
    placement = watch_placement(proc, nodes.address, timeout=240)
    first = finish(proc, 300, "multinode run 1")
    assert first.rc == 0, first.out[-4000:]

    # placement: every actor class on the node the config named — a config that ignored it could land anywhere
    missing = [c for c in WATCHED if c not in placement]
    assert not missing, f"never saw {missing} alive (placement={placement}):\n{first.out[-2000:]}"
    assert placement["TrainerWorker"] == {nodes.trainer_node}, placement
    assert placement["GenerationWorker"] == {nodes.gen_node}, placement
    assert placement["SimpleStorageUnit"] == {nodes.gen_node}, placement
    assert nodes.head not in placement["TrainerWorker"] | placement["GenerationWorker"]
    # the controller actor follows the driver (soft affinity): the node of the lease, and of the bundles it commits
    # when each pod has its own checkpoint directory
    assert placement["SingleControllerActor"] == {nodes.head}, placement

    # two trainer workers formed a torch.distributed group over gloo
    assert re.search(r"gloo.*world size 2", first.out), first.out[-3000:]
    assert "starting fresh" in first.out and "done: step 4" in first.out
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_2", "step_4"]
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0, verify.out
    dp = json.loads((ckpt / "step_4" / "data_plane" / "metadata.json").read_text())
    assert len(dp["streams"]) == 2, "run 1's snapshot must come from two units (else the resume proves nothing)"
    manifest = json.loads((ckpt / "step_4" / "manifest.json").read_text())
    assert manifest["compat"]["data_plane.storage_units"] == 2
    rows = manifest["replay"]["rows"]
    assert rows > 0, "step_4 holds no rows: the restore would be vacuous"

    second = sc_app(*cluster_args(nodes, ckpt, trace, 6, units=1), timeout=300)
    assert second.rc == 0, second.out[-4000:]
    m = re.search(r"resuming from (\S+) \(step (\d+)\)", second.out)
    assert m and Path(m.group(1)).name == "step_4" and m.group(2) == "4", second.out[-3000:]
    assert "done: step 6" in second.out
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    starts = [e for e in events if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0, 4]
    sidecar = load_sidecar(ckpt / "step_4" / "replay_buffer_metadata.pt")
    assert starts[1]["restored_rows"] == rows == sum(len(g["sample_ids"]) for g in sidecar["groups"].values())
    trained = [e["step"] for e in events if e["ev"] == "train"]
    assert trained == [1, 2, 3, 4, 5, 6], trained
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_2", "step_4", "step_6"]
    dp6 = json.loads((ckpt / "step_6" / "data_plane" / "metadata.json").read_text())
    assert len(dp6["streams"]) <= 1, "run 2's own bundle comes from its single unit"
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0, verify.out
    for name in ("step_2", "step_4", "step_6"):
        assert f"{name}: verified" in verify.out
