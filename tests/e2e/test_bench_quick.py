"""``bench/run --quick`` end to end: it runs, writes its outputs, and every result it reports is *correct*.

No timing is asserted (the machines are shared and noisy); the bench itself fails on wrong results (row sets,
round-trip bytes, resume step), and this test checks the report's structure and the invariants that do not
depend on speed: the streamed bundle holds the live bytes (and TransferQueue's native one does not).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import REPO


@pytest.mark.slow
def test_bench_quick_runs_and_reports(tmp_path: Path) -> None:
    out, work = tmp_path / "results", tmp_path / "work"
    env = {**os.environ, "SC_APP_PYTHON": sys.executable}
    proc = subprocess.run(
        [str(REPO / "bench" / "run"), "--quick", "--out", str(out), "--work", str(work)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "latest.json").read_text())
    md = (out / "latest.md").read_text()
    assert res["quick"] is True
    for png in ("throughput.png", "stall_and_size.png", "controller_and_putget.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "### Targets" in md and "streamed save" in md

    (dp,) = res["data_plane"]  # smallest size only
    assert dp["size_mib"] == 16 and dp["live_bytes"] == 16 * 1024 * 1024
    streamed = dp["streamed"]
    # streamed bundle = live tensor bytes + JSON headers; native pickles each row with its whole put buffer
    assert 1.0 <= streamed["bundle_over_live"] <= 1.01
    assert dp["native"]["bundle_over_live"] > 2
    assert streamed["commits_during_saves"] > 0 and dp["native"]["commits_during_saves"] > 0
    for key in ("save_mib_s", "window_ms"):
        assert streamed[key]["n"] >= 1 and streamed[key]["median"] > 0
    assert dp["streamed_restore_mib_s"]["median"] > 0 and dp["raw_read_mib_s"]["median"] > 0

    e2e = res["end_to_end"]
    assert e2e["steps_s_on"]["median"] > 0 and e2e["window_ms"]["n"] >= 1
    assert e2e["resume_big"]["data_plane_mib"] >= 15

    rows = {p["row_bytes"]: p for p in res["put_get"]}
    assert set(rows) == {1024, 1024 * 1024}
    assert all(p[k]["mib_s"]["median"] > 0 for p in rows.values() for k in ("tq_put", "tq_get", "ray_put", "ray_get"))
    assert {t["target"].split(" ")[0] for t in res["targets"]} >= {"save", "restore", "bundle", "p99"}
