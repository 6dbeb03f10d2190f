"""Per-unit snapshot streams on a multi-node local Ray cluster (``ray.cluster_utils.Cluster``).

Two storage units on two worker nodes (the driver on the head): a streamed save runs one stream per unit in a
``StreamWorker`` on that unit's node, and a restore again one per unit; the rows, tags and bytes that come back
must be exactly the ones committed (less the dropped groups). The scenario runs in a subprocess of its own session
(``tests/support/multinode_snapshot.py``; it starts and stops its cluster), killed as a whole if it hangs. What
only a real cluster can show — that a unit's stream moves its bytes without crossing the network — is not
measured here: these nodes share one machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import REPO, kill_session

pytestmark = pytest.mark.slow


def test_each_units_rows_are_saved_and_restored_by_a_worker_on_its_node(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.multinode_snapshot", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        kill_session(proc.pid)
    assert proc.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])

    # each unit on its own worker node; each save stream ran remotely, in a worker on exactly that unit's node
    assert sorted(report["unit_nodes"].values()) == report["tq_nodes"]
    assert report["head"] not in report["tq_nodes"]
    assert [s["where"] for s in report["save_streams"]] == ["remote", "remote"]
    assert {s["unit"] for s in report["save_streams"]} == set(report["unit_nodes"])
    assert all(node == placed for node, placed in report["worker_nodes"].items())
    assert set(report["worker_nodes"]) == set(report["tq_nodes"])
    assert report["streams_in_metadata"] == 2 and sum(s["rows"] for s in report["save_streams"]) == 88
    assert report["restore_streams"] == ["remote", "remote"]
    # and what came back is exactly what was committed
    assert report["rows_written"] == 88
    assert report["restored_digest"] and report["row_set_equal"] and report["tags_equal"] and report["bytes_equal"]
