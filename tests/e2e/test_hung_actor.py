"""One run, three hung (SIGSTOPped, not dead) processes (real CLI, Ray, TransferQueue) — issue 31, class A.

A stopped process answers nothing and never dies, so neither a failing call nor the GCS's actor table reports it;
the driver's heartbeats do (``sc_app.attempt.poll.Heartbeat``). In turn, each once the run recovered from the one
before and trained on:

* a trainer rank, then a TransferQueue storage unit: the controller waits on them, no step is reported for
  ``run.hang_timeout_s`` → one ``fault hang`` line and event, the processes that do not answer a probe are killed
  (``ray.kill`` ends a stopped process too) and the warm in-job restore (the default) starts only them again — the
  whole data plane for a unit — and resets the rest in place, their PIDs kept; training goes on from the newest
  bundle;
* the controller actor, then SIGTERM to the driver (the issue's example: the driver used to block in ``ray.get``
  forever): the stop is looked at every poll, the emergency budget bounds it, the run exits 1
  (``EmergencyTimeout``, docs/recovery.md) within the budget, naming the hung controller, and the newest bundle
  verifies. The frozen seconds are never training in the goodput ledger: no step line holds them.

Its own run (not the shared four-kills run): each hang costs ``run.hang_timeout_s`` plus a warm restore, and this run
must end on SIGTERM with exit 1 where the shared runs end at max_steps with exit 0.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from sc_app.observe.goodput import ledger
from sc_app.observe.reader import read_history
from tests.support.console import foreign_lines
from tests.support.proc import actor_pids, finish, read_trace, run_args, sc_app, start_logged, wait_for
from tests.support.restart import attempts_of

pytestmark = pytest.mark.slow

HANG_S = 15.0  # run.hang_timeout_s: well above a tiny step under load
BUDGET_S = 20.0  # checkpoint.emergency_budget_s


def trains_in(trace: Path, start: int) -> int:
    parts = attempts_of(read_trace(trace)) if trace.exists() else []
    return sum(e["ev"] == "train" for e in parts[start]) if len(parts) > start else 0


ACTORS = ["SingleControllerActor", "GenerationWorker", "TrainerWorker", "SimpleStorageUnit", "TransferQueueController"]
RESTARTED = {  # the stopped actor's class → what a warm restore starts again (TransferQueue: all or nothing)
    "TrainerWorker": {"TrainerWorker"},
    "SimpleStorageUnit": {"SimpleStorageUnit", "TransferQueueController"},
}


def pids_of(sid: int) -> dict[str, list[int]]:
    return {actor: sorted(actor_pids(sid, actor)) for actor in ACTORS}


def stop_one(sid: int, actor: str) -> int:
    pids = actor_pids(sid, actor)
    assert pids, f"no {actor} process"
    os.kill(pids[0], signal.SIGSTOP)
    return pids[0]


RAY_KILL_GRACE_S = 5 + 10  # Ray's kill_worker_timeout_milliseconds (SIGTERM, then SIGKILL 5 s later) + a margin


def wait_until_stopped_gone(proc: Any, stopped: list[tuple[str, int, Any]], log: Path) -> None:
    """Wait until the last stopped process is gone: ``ray.kill`` of a hung actor sends SIGTERM, which a stopped
    process holds, and SIGKILL 5 s later (Ray's default), so after a restore quicker than that it is still listed
    for a moment; it must be gone within that grace."""
    if not stopped:
        return
    actor, victim, _ = stopped[-1]

    def gone() -> bool:
        return victim not in actor_pids(proc.pid, actor)

    wait_for(gone, RAY_KILL_GRACE_S, f"the stopped {actor} gone", proc, log=log)


def test_hung_trainer_storage_and_controller(tmp_path: Path) -> None:
    ckpt, trace, log = tmp_path / "ckpt", tmp_path / "trace.jsonl", tmp_path / "run.log"
    extra = ["--set", f"run.hang_timeout_s={HANG_S:g}", "--set", f"checkpoint.emergency_budget_s={BUDGET_S:g}"]
    proc = start_logged(*run_args(ckpt, trace, 100_000, *extra), log=log)  # run.in_job_restore: warm (default)
    stopped_pids: list[tuple[str, int, dict[str, list[int]]]] = []  # (class, the stopped PID, the PIDs just before)
    after: list[dict[str, list[int]]] = []  # the PIDs once the job trained 3 steps after each restore
    try:
        for n, actor in enumerate(["TrainerWorker", "SimpleStorageUnit"]):
            wait_for(lambda n=n: trains_in(trace, n) >= 3, 600, f"3 steps before stopping {actor}", proc, log=log)
            wait_until_stopped_gone(proc, stopped_pids, log)
            after.append(before := pids_of(proc.pid))
            stopped_pids.append((actor, stop_one(proc.pid, actor), before))
        wait_for(lambda: trains_in(trace, 2) >= 3, 600, "3 steps after the second restore", proc, log=log)
        wait_until_stopped_gone(proc, stopped_pids, log)
        after.append(pids_of(proc.pid))
        stop_one(proc.pid, "SingleControllerActor")
        time.sleep(2)
        os.kill(proc.pid, signal.SIGTERM)
        stopped = time.monotonic()
        run = finish(proc, BUDGET_S + 90, "the run after SIGTERM with its controller stopped")
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    out = log.read_text()
    assert run.rc == 1, out[-4000:]
    assert took < BUDGET_S + 30, f"exited {took:.0f}s after SIGTERM against a {BUDGET_S:g}s budget"
    assert f"emergency checkpoint did not finish within checkpoint.emergency_budget_s={BUDGET_S:g}s" in out, out[-3000:]
    assert "the controller actor had not answered for" in out and "Traceback" not in out, out[-3000:]
    assert not foreign_lines(out), foreign_lines(out)[:5]  # Ray's and TransferQueue's lines: libraries.log
    assert "ray._private.worker" in (ckpt / "logs" / "libraries.log").read_text()

    faults = list(read_history(ckpt / "logs").events_named("fault"))
    assert [f.data["fault"] for f in faults] == ["hang", "hang"], out[-3000:]
    assert all(f.data["outcome"] == "recovered" and f.data["detection_s"] >= HANG_S for f in faults)
    # warm: the stopped process killed and started again like a dead one, every other process kept (by PID)
    assert [f.data["path"] for f in faults] == ["warm", "warm"], [f.data["path"] for f in faults]
    for (actor, victim, before), now in zip(stopped_pids, after[1:], strict=True):
        assert victim not in now[actor], f"the stopped {actor} ({victim}) is still there: {now[actor]}"
        for other in ACTORS:
            changed = before[other] != now[other]
            assert changed == (other in RESTARTED[actor]), (
                f"after {actor} hung, {other} {'restarted' if changed else 'kept'}: {before[other]} -> {now[other]}"
            )
    trainer, storage = (f.data for f in faults)
    assert [r for r in trainer["restarted"] if r.startswith("trainer rank")] == trainer["restarted"], trainer
    assert "hung" in trainer["error"] and "killed" in trainer["error"], trainer["error"]
    assert [r for r in storage["restarted"] if r.startswith("TransferQueue")], storage
    assert {"the controller actor", "generation worker 0"} <= set(trainer["reset"]) & set(storage["reset"])
    assert out.count("fault hang: recovered") == 2, out[-3000:]
    starts = [e for e in read_trace(trace) if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0] + [f.data["restored_step"] for f in faults]

    history = read_history(ckpt / "logs")
    assert all(s.record.step_seconds < HANG_S for s in history.steps), "a frozen step is never a step line"
    money = ledger(history)
    (attempt,) = money.attempts
    assert money.seconds["training"] < attempt.wall_s - 2 * HANG_S, "the frozen seconds are not training"
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    assert verify.rc == 0, verify.out
