"""Preemption, kill-anywhere and disk pressure — real processes, real Ray, real TransferQueue, real files.

Each test drives the real CLI in subprocesses (its own session, cleaned up by ``kill_session``). Fencing (a retry
takes the lease from a writer still running) is part of ``tests/e2e/test_bystanders.py``'s scenario.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from sc_app.checkpoint import plan_resume, verify_bundle
from tests.support.cli import InProcess
from tests.support.interrupted import Interrupted
from tests.support.proc import (
    kill_session,
    load_sidecar,
    read_trace,
    run_args,
    sc_app,
    start_logged,
    trace_runs,
    wait_for,
)

pytestmark = pytest.mark.slow
GROUP_SIZE = 8


def bundles(root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name))


def manifest(root: Path, step: int) -> dict:
    return json.loads((root / f"step_{step}" / "manifest.json").read_text())


def starts(trace: Path) -> list[dict]:
    return [e for e in read_trace(trace) if e["ev"] == "start"]


def assert_restored_rows_match(root: Path, step: int, start_event: dict) -> None:
    """The rows TransferQueue held after restore equal what that bundle's sidecar index lists."""
    sidecar = load_sidecar(root / f"step_{step}" / "replay_buffer_metadata.pt")
    assert start_event["step"] == step
    assert start_event["restored_rows"] == len(sidecar["groups"]) * GROUP_SIZE


def test_sigterm_cuts_an_emergency_bundle_and_resume_continues(interrupted_run: Interrupted) -> None:
    """Attempt C of the shared interrupted run (``tests/support/interrupted.py``): SIGTERM to the driver alone, as
    Kubernetes signals a pod's PID 1, while it trains with no periodic save due (``save_period=100``)."""
    k = interrupted_run
    ckpt, out = k.ckpt, k.outs["C"]
    assert k.c_rc == 143, out[-3000:]
    runs = trace_runs(k.trace)
    trained = max(e["step"] for e in runs[2] if e["ev"] == "train")
    c_run_id = runs[2][0]["run_id"]
    c_bundles = [s for s in bundles(ckpt) if manifest(ckpt, s)["run_id"] == c_run_id]
    assert c_bundles == [trained] == [k.stopped_at], f"expected one bundle of the current step {trained}: {c_bundles}"
    assert verify_bundle(ckpt / f"step_{trained}").ok
    assert "stopping after the current step and saving" in out
    resumed = k.outs["D"]
    assert f"resuming from {ckpt / f'step_{trained}'} (step {trained})" in resumed
    assert_restored_rows_match(ckpt, trained, runs[3][0])
    assert bundles(ckpt)[-1] == k.final


def test_kill_inside_the_barrier_window_and_before_the_rename(cli: InProcess, tmp_path: Path) -> None:
    """SIGKILL the saving controller at two phases in a row; each time the newest complete bundle is resumed by the
    next start. The process-restart path: in-job restores are off here (``tests/e2e/test_in_job_restore.py`` has
    the same deaths restored in-job), so the disk is seen exactly as a crash left it."""
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"

    def run(max_steps: int, fault: dict[str, str] | None) -> str:
        marker = tmp_path / "fault.marker"
        env = {"SC_APP_FAULT_MARKER": str(marker), **(fault or {})}
        res = sc_app(*run_args(ckpt, trace, max_steps, "--set", "run.max_in_job_restores=0"), env=env)
        if fault:
            assert res.rc == 1, res.out[-3000:]
            assert "controller actor died" in res.out
            assert marker.read_text().splitlines()[-1] == fault["SC_APP_FAULT_AT"]
        else:
            assert res.rc == 0, res.out[-3000:]
        return res.out

    # 1: step_2 is saved; the save of step_4 dies holding the barrier's exclusive window (before any of its
    # files exist: the window only captures, the files are written after it)
    run(4, {"SC_APP_FAULT_AT": "save.window", "SC_APP_FAULT_AFTER": "1"})
    assert bundles(ckpt) == [2]
    assert not list(ckpt.glob("tmp_step_*"))

    # 2: resume from step_2; the save of step_4 dies after its manifest and fsync, just before the rename
    out = run(4, {"SC_APP_FAULT_AT": "save.rename"})
    assert "(step 2)" in out
    assert_restored_rows_match(ckpt, 2, starts(trace)[-1])
    assert bundles(ckpt) == [2], "a bundle that was never renamed is never resumable"
    (leftover,) = ckpt.glob("tmp_step_4.*")  # named by the run that wrote it
    assert (leftover / "manifest.json").exists()
    pre = cli("preflight", "--checkpoint-dir", str(ckpt), "--json")
    plan = json.loads(pre.out)
    assert pre.rc == 0 and plan["decision"] == "resume" and plan["step"] == 2
    assert not leftover.exists(), "preflight moves the leftover aside"
    assert any(p.name.startswith("tmp_step_4.") for p in (ckpt / "quarantine").iterdir())

    # 3: resume again from step_2 and finish; the restored rows equal step_2's index both times
    out = run(5, None)
    assert "(step 2)" in out
    assert_restored_rows_match(ckpt, 2, starts(trace)[-1])
    assert bundles(ckpt) == [2, 4, 5]
    trained = [e["step"] for e in read_trace(trace) if e["ev"] == "train"]
    assert trained[-3:] == [3, 4, 5], "the step counter continues from the bundle without gap"


@pytest.fixture
def small_fs(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root (CI and the dev machines run as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3600k", "tmpfs", str(mnt)], check=True, capture_output=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("policy", ["continue", "stop"])
def test_full_disk_fails_only_the_save_and_keeps_older_bundles(small_fs: Path, policy: str) -> None:
    ckpt = small_fs / f"ckpt-{uuid.uuid4().hex[:6]}"
    res = sc_app(
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        "6",
        "--set",
        "checkpoint.save_period=2",
        "--set",
        "checkpoint.keep=5",
        "--set",
        f"checkpoint.on_save_error={policy}",
    )
    assert bundles(ckpt)[:1] == [2], res.out[-3000:]
    failed = [s for s in (2, 4, 6) if s not in bundles(ckpt)]
    assert failed, f"the filesystem was expected to fill up: {bundles(ckpt)}"
    assert "No space left on device" in res.out
    assert not list(ckpt.glob("tmp_step_*")), "a failed save removes its own tmp dir"
    assert all(verify_bundle(ckpt / f"step_{s}").ok for s in bundles(ckpt)), "older bundles stay intact"
    if policy == "continue" and 6 in bundles(ckpt):
        assert res.rc == 0 and "SAVE FAILED" in res.out and "done: step 6" in res.out
    elif policy == "continue":  # no success over lost work: the final step is not covered by a bundle
        assert res.rc == 1 and "SAVE FAILED" in res.out, res.out[-3000:]
        assert f"{6 - max(bundles(ckpt))} steps are not covered by a bundle" in res.out, res.out[-3000:]
    else:
        assert res.rc == 1
        assert "checkpoint.on_save_error=stop" in res.out
    assert plan_resume(ckpt, tidy=False).step == max(bundles(ckpt))


def test_sigterm_while_ray_is_starting_keeps_the_exit_contract(tmp_path: Path) -> None:
    """A preemption notice that arrives before training started: exit 143, the same line, no traceback; the job's
    processes are never started once the stop came in during Ray's start (they used to be, and TransferQueue's
    start waited out before the stop was seen: ~10 s more to exit)."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "run.log"
    proc = start_logged("run", "--checkpoint-dir", str(ckpt), "--max-steps", "50", log=log)
    try:
        wait_for(lambda: "starting fresh" in log.read_text(), 120, "the resume plan (Ray starts next)", proc)
        os.kill(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=600)  # a hang guard: at load 40-60 the stop during the Ray start took over 120 s
    finally:
        kill_session(proc.pid)
    out = log.read_text()
    assert rc == 143, out[-3000:]
    assert "received SIGTERM: stopping after the current step and saving" in out
    assert "a stop was requested before the job's processes were started" in out, out[-3000:]
    assert "Traceback" not in out and not bundles(ckpt)
    released = json.loads((ckpt / "LEASE").read_text())["released"]
    assert released["outcome"] == "stopped", released
