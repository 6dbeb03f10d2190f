"""Nothing a bystander does hurts a live job, a retry fences the old writer off, and `sc-app stop` stops the
retry gracefully — real runs, real files.

One scenario on one checkpoint dir, three runs (each in its own session):
  L. the live run; beside it, what operators and other runs do: preflight (with and without --dry-run), ckpt
     list/verify/prune, runs that are refused (incompatible config, nothing left to train). L keeps its lease and
     keeps publishing;
  R. its retry, started while L still trains (a retry whose predecessor's pods are still terminating): R takes the
     lease, L is superseded (exit 3) and publishes nothing after R took over, R resumes L's newest bundle and
     tidies the leftover save L owned; then `sc-app stop --wait` stops R, which cuts a bundle of the step it
     reached (exit 143);
  a rerun is not stopped by the request left on the volume and resumes from R's stop bundle.
The bystanders (and ``sc-app stop``) are called in the test's process (the ``cli`` fixture): a process other than
the runs', as an operator's would be, without an interpreter start each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from tests.support.cli import InProcess
from tests.support.proc import kill_session, read_trace, run_args, sc_app, start_logged, wait_for

pytestmark = pytest.mark.slow
# A guard against a hang, not a timing check: the retry's Ray start alone took minutes at load 40-60 on 2 cores
# (180 s for its first bundle timed out there, in this scenario and in the fencing test it came from).
DEADLINE = 600
KEEP = ("--set", "checkpoint.keep=50")  # L's newest bundle stays while R saves: who published what is checked


def bundles(root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name))


def lease(root: Path) -> dict:
    return json.loads((root / "LEASE").read_text())


def manifest(root: Path, step: int) -> dict:
    return json.loads((root / f"step_{step}" / "manifest.json").read_text())


def test_bystanders_never_hurt_a_live_run_a_retry_fences_it_off_and_stop_stops_it(
    cli: InProcess, tmp_path: Path
) -> None:
    ckpt, l_log, r_log = tmp_path / "ckpt", tmp_path / "live.log", tmp_path / "retry.log"
    l_trace, r_trace = tmp_path / "live.jsonl", tmp_path / "retry.jsonl"
    live = start_logged(*run_args(ckpt, l_trace, 100_000, *KEEP), log=l_log)
    retry = None
    try:
        # ------------------------------------------------------------------------------ L and the bystanders
        wait_for(lambda: len(bundles(ckpt)) >= 2, DEADLINE, "two bundles of the live run", live)
        holder = lease(ckpt)
        # a save of the live writer that is in progress (a tmp dir it owns)
        in_progress = ckpt / "tmp_step_999999"
        in_progress.mkdir()
        (in_progress / "partial.bin").write_bytes(b"\0" * 1024)

        looked = cli("preflight", "--checkpoint-dir", str(ckpt))
        assert looked.rc == 0, looked.out
        assert "moved nothing" in looked.out and holder["run_id"] in looked.out, looked.out
        for args in (
            ["preflight", "--checkpoint-dir", str(ckpt), "--dry-run", "--json"],
            ["ckpt", "list", "--checkpoint-dir", str(ckpt)],
            ["ckpt", "verify", "--checkpoint-dir", str(ckpt)],  # bundles pruned meanwhile are "gone", not bad
        ):
            assert cli(*args).rc == 0
        assert in_progress.is_dir() and not (ckpt / "quarantine").exists(), "a bystander moved the live save"

        pruned = cli("ckpt", "prune", "--checkpoint-dir", str(ckpt), "--keep", "1")
        assert pruned.rc == 2 and "holds a live lease" in pruned.out, pruned.out

        refused = cli(*run_args(ckpt, tmp_path / "t2.jsonl", 100_000, "--set", "grpo.group_size=4"))
        assert refused.rc == 2 and "incompatible" in refused.out, refused.out[-2000:]
        behind = cli("run", "--checkpoint-dir", str(ckpt), "--max-steps", "1")
        assert behind.rc == 0 and "nothing to train" in behind.out, behind.out[-2000:]
        assert lease(ckpt)["epoch"] == holder["epoch"] and lease(ckpt)["run_id"] == holder["run_id"]

        newest = bundles(ckpt)[-1]
        wait_for(lambda: bundles(ckpt)[-1] > newest, DEADLINE, "a save after the bystanders", live)
        assert live.poll() is None, "the live run must still be training"

        # ------------------------------------------------------------------------------ R fences L off
        retry = start_logged(*run_args(ckpt, r_trace, 100_000, *KEEP), log=r_log)
        live_rc = live.wait(timeout=DEADLINE)
        wait_for(lambda: "resuming from" in r_log.read_text(), DEADLINE, "the retry's resume line", retry)
        taken = lease(ckpt)
        wait_for(
            lambda: any(manifest(ckpt, s)["run_id"] == taken["run_id"] for s in bundles(ckpt)),
            DEADLINE,
            "a bundle from the retry",
            retry,
        )

        # ------------------------------------------------------------------------------ stop stops R
        stopped = cli("stop", "--checkpoint-dir", str(ckpt), "--wait", "180", within=240)
        assert stopped.rc == 0 and "stopped: run" in stopped.out, stopped.out
        assert retry.wait(timeout=60) == 143
    finally:
        kill_session(live.pid)
        if retry is not None:
            kill_session(retry.pid)
    l_out, r_out = l_log.read_text(), r_log.read_text()
    assert live_rc == 3, l_out[-3000:]
    assert "superseded" in l_out
    assert taken["epoch"] == holder["epoch"] + 1 and taken["previous"]["run_id"] == holder["run_id"]
    resumed_step = int(re.search(r"resuming from \S+ \(step (\d+)\)", r_out).group(1))
    l_steps = [s for s in bundles(ckpt) if manifest(ckpt, s)["run_id"] == holder["run_id"]]
    assert max(l_steps) == resumed_step, "the old run published after its retry took the lease"
    assert all(manifest(ckpt, s)["epoch"] == taken["epoch"] for s in bundles(ckpt) if s > resumed_step)
    assert f"quarantined {in_progress.name}" in r_out, "the new holder tidies the leftover once the writer is gone"

    trained = max(e["step"] for e in read_trace(r_trace) if e["ev"] == "train")
    assert f"saved step_{trained}" in r_out and f"stopped: step {trained} saved on request" in r_out, r_out[-3000:]
    assert bundles(ckpt)[-1] == trained
    assert all(verify_bundle(ckpt / f"step_{s}").ok for s in bundles(ckpt))
    released = lease(ckpt)["released"]
    assert released["outcome"] == "stopped" and released["final_step"] == trained
    assert (ckpt / "STOP").exists(), "the request stays on the volume: the rerun below must ignore it"

    rerun = sc_app(*run_args(ckpt, r_trace, trained + 2))
    assert rerun.rc == 0, rerun.out[-3000:]
    assert f"resuming from {ckpt / f'step_{trained}'}" in rerun.out and f"done: step {trained + 2}" in rerun.out
