"""``bench/run --quick`` end to end: it runs, writes its outputs, and every result it reports is *correct*.

No timing is asserted (the machines are shared and noisy); the bench itself fails on wrong results (row sets,
round-trip bytes, resume step), and this test checks the report's structure and the invariants that do not
depend on speed: the streamed bundle holds the live bytes (and TransferQueue's native one does not), a snapshot
has one stream per storage unit, every train step reports where its time went, and every section and target the
issue asks for is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sc_app.phases import ALL
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
        timeout=850,  # under pytest's 900 s per test
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((out / "latest.json").read_text())
    md = (out / "latest.md").read_text()
    assert res["quick"] is True
    for png in ("throughput.png", "stall_and_size.png", "phases.png", "controller_and_putget.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    assert "### Targets" in md and "streamed save" in md and "ceiling" in md

    # sections 1-3: the smallest size, with one and with two storage units
    by_units = {r["units"]: r for r in res["data_plane"]}
    assert set(by_units) == {1, 2} and all(r["size_mib"] == 16 for r in by_units.values())
    for units, dp in by_units.items():
        streamed = dp["streamed"]
        assert dp["live_bytes"] == 16 * 1024 * 1024
        # streamed bundle = live tensor bytes + JSON headers, one stream of part files per storage unit
        assert 1.0 <= streamed["bundle_over_live"] <= 1.01 and streamed["streams"] == units
        assert streamed["commits_during_saves"] > 0 and streamed["window_ms"]["n"] >= 1
        for key in ("save_ceiling_mib_s", "restore_ceiling_mib_s", "tq_get_mib_s", "tq_put_mib_s"):
            assert dp[key]["median"] > 0, key
        assert streamed["save_over_ceiling"] > 0 and streamed["restore_over_ceiling"] > 0
        # CPU-seconds of every process, beside the wall clock (issue 21): each candidate, its roles, the ratios
        cpu = dp["cpu"]
        for cand in ("save", "tq_get", "raw_write", "restore", "tq_put", "raw_read"):
            assert cpu[cand]["raw_cpu_s_per_gib"] > 0 and cpu[cand]["by_role"]["driver"] >= 0, cand
        assert cpu["save"]["by_role"].get("storage units", 0) > 0, "the storage units' CPU is counted"
        assert cpu["save_over_baseline"] > 0 and cpu["restore_over_baseline"] > 0
    assert {"sha256", "blake3", "write_blake3_same_pass", "memcpy"} <= set(res["stages"]["cpu_ms_per_mib"])
    assert "skipped" in res["hf_run"] and "skipped" in res["policy_save"], "quick leaves the hf sections out"
    assert "### CPU cost of a save and a restore" in md
    native = by_units[1]["native"]  # TransferQueue's own snapshot pickles each row with its whole put buffer
    assert native["bundle_over_live"] > 2 and native["commits_during_saves"] > 0

    # sections 4-5: every step split into the documented phases, at the default config and the realistic shape
    e2e = res["end_to_end"]
    assert e2e["steps_s_on"]["median"] > 0 and e2e["window_ms"]["n"] >= 1
    assert set(e2e["phases_default"]["phases"]) == set(ALL)
    now = e2e["realistic"]["now"]
    assert e2e["realistic"]["rows_per_step"] == 1024 and 1800 <= e2e["realistic"]["row_bytes"] <= 2300
    assert now["runs"] == 1 and 0 < now["data_plane_share"] < 1 and now["phases"]["put"] > 0
    assert e2e["resume_big"]["data_plane_mib"] >= 15 and len(e2e["resume_big"]["rounds"]) == 1

    # section 6: the product path and TransferQueue's own client at every batch size
    shapes = {(p["row_bytes"], p["groups_per_call"]) for p in res["put_get"]}
    assert shapes == {(1024, 1), (1024, 4), (1024, 32), (1 << 20, 1), (1 << 20, 4)}
    for p in res["put_get"]:
        for who in ("adapter", "tq", "shipped"):
            assert all(p[f"{who}_{op}"]["rows_s"]["median"] > 0 for op in ("put", "get", "clear")), who
    targets = {t["target"].split(",")[0] for t in res["targets"]}
    assert any(t.startswith("data-plane ops <= 10%") for t in targets)
    assert any(t.startswith("adapter >= 0.8x") for t in targets)
    assert any(t.startswith("save >= 0.8x its ceiling") for t in targets) is False  # quick: no size >= 64 MiB
    assert {"bundle <= 1.1x live after churn", "p99 commit wait during a save <= 50 ms"} <= targets
