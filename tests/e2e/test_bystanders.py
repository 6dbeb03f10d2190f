"""Nothing a bystander does hurts a live job, and `sc-app stop` stops it gracefully — real runs, real files.

One live run (its own session) on a checkpoint dir; beside it, what operators and other runs do: preflight
(with and without --dry-run), ckpt list/verify/prune, runs that are refused (incompatible config, nothing left to
train), then `sc-app stop --wait`. The live run keeps its lease and keeps publishing until the stop, which cuts a
bundle of the step it reached; a rerun is not stopped by the request left on the volume and resumes from it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from tests.support.proc import kill_session, read_trace, run_args, sc_app, start_logged, wait_for

pytestmark = pytest.mark.slow


def bundles(root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name))


def lease(root: Path) -> dict:
    return json.loads((root / "LEASE").read_text())


def test_bystanders_never_hurt_a_live_run_and_stop_stops_it(tmp_path: Path) -> None:
    ckpt, trace, log = tmp_path / "ckpt", tmp_path / "trace.jsonl", tmp_path / "live.log"
    live = start_logged(*run_args(ckpt, trace, 100_000), log=log)
    try:
        wait_for(lambda: len(bundles(ckpt)) >= 2, 240, "two bundles of the live run", live)
        holder = lease(ckpt)
        # a save of the live writer that is in progress (a tmp dir it owns)
        in_progress = ckpt / "tmp_step_999999"
        in_progress.mkdir()
        (in_progress / "partial.bin").write_bytes(b"\0" * 1024)

        looked = sc_app("preflight", "--checkpoint-dir", str(ckpt), timeout=120)
        assert looked.rc == 0, looked.out
        assert "moved nothing" in looked.out and holder["run_id"] in looked.out, looked.out
        for args in (
            ["preflight", "--checkpoint-dir", str(ckpt), "--dry-run", "--json"],
            ["ckpt", "list", "--checkpoint-dir", str(ckpt)],
            ["ckpt", "verify", "--checkpoint-dir", str(ckpt)],  # bundles pruned meanwhile are "gone", not bad
        ):
            assert sc_app(*args, timeout=120).rc == 0
        assert in_progress.is_dir() and not (ckpt / "quarantine").exists(), "a bystander moved the live save"

        pruned = sc_app("ckpt", "prune", "--checkpoint-dir", str(ckpt), "--keep", "1", timeout=120)
        assert pruned.rc == 2 and "holds a live lease" in pruned.out, pruned.out

        refused = sc_app(*run_args(ckpt, tmp_path / "t2.jsonl", 100_000, "--set", "grpo.group_size=4"))
        assert refused.rc == 2 and "incompatible" in refused.out, refused.out[-2000:]
        behind = sc_app("run", "--checkpoint-dir", str(ckpt), "--max-steps", "1", timeout=120)
        assert behind.rc == 0 and "nothing to train" in behind.out, behind.out[-2000:]
        assert lease(ckpt)["epoch"] == holder["epoch"] and lease(ckpt)["run_id"] == holder["run_id"]

        newest = bundles(ckpt)[-1]
        wait_for(lambda: bundles(ckpt)[-1] > newest, 240, "a save after the bystanders", live)
        assert live.poll() is None, "the live run must still be training"

        stopped = sc_app("stop", "--checkpoint-dir", str(ckpt), "--wait", "180", timeout=240)
        assert stopped.rc == 0 and "stopped: run" in stopped.out, stopped.out
        assert live.wait(timeout=60) == 143
    finally:
        kill_session(live.pid)
    out = log.read_text()
    trained = max(e["step"] for e in read_trace(trace) if e["ev"] == "train")
    assert f"saved step_{trained}" in out and f"stopped: step {trained} saved on request" in out, out[-3000:]
    assert bundles(ckpt)[-1] == trained and verify_bundle(ckpt / f"step_{trained}").ok
    released = lease(ckpt)["released"]
    assert released["outcome"] == "stopped" and released["final_step"] == trained
    assert (ckpt / "STOP").exists(), "the request stays on the volume: the rerun below must ignore it"

    rerun = sc_app(*run_args(ckpt, trace, trained + 2))
    assert rerun.rc == 0, rerun.out[-3000:]
    assert f"resuming from {ckpt / f'step_{trained}'}" in rerun.out and f"done: step {trained + 2}" in rerun.out
    assert f"quarantined {in_progress.name}" in rerun.out, "the holder tidies the leftover once the writer is gone"
