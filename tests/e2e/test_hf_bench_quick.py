"""``bench/hf_policy_save.py --quick`` end to end: it runs, writes its outputs, and what it reports is consistent.

No timing is asserted; the bench itself fails when the ranks' written bytes differ from what is on disk.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import REPO


@pytest.mark.slow
def test_hf_policy_save_bench_quick(tmp_path: Path) -> None:
    out, work = tmp_path / "results", tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "hf_policy_save.py"), "--quick", "--out", str(out), "--work", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "hf_policy_save.json").read_text())
    worlds = doc["results"]["small"]["worlds"]
    assert [w["world"] for w in worlds] == [1, 2]
    for w in worlds:
        assert len(w["per_rank_bytes"]) == w["world"] and sum(w["per_rank_bytes"]) == w["bytes"] > 0
        assert w["dcp_mib_s"]["n"] == w["raw_mib_s"]["n"] == w["paused_ms"]["n"] >= 1
    one, two = worlds
    assert abs(two["bytes"] - one["bytes"]) < 0.01 * one["bytes"], "2 ranks write the same state, split in two"
    assert "| small |" in (out / "hf_policy_save.md").read_text()
    assert not list(work.iterdir()), "the bench leaves its scratch directory empty"
