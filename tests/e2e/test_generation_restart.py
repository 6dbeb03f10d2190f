"""A generation worker killed by PID (SIGKILL) mid-run is replaced in the same job (real CLI, Ray, TransferQueue).

The run's only generation worker is SIGKILLed once training is under way. The run must finish with exit 0 and one
start (no process exit, no retry); the dead worker's in-flight prompts go back to the loader once (a ``give_back``
trace event) and are issued and trained again — no prompt is trained twice and none is skipped; the new worker got
the weights version training was at before its first generate call; the fault is a printed line and a run-log
``fault`` event with its cost; every bundle verifies.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from sc_app.observe.reader import read_history
from tests.support.proc import actor_pids, finish, read_trace, run_args, start_logged, wait_for
from tests.support.restart import generation_restart_problems

pytestmark = pytest.mark.slow

MAX_STEPS = 12


def test_a_killed_generation_worker_is_replaced_in_job(tmp_path: Path) -> None:
    ckpt, trace, log = tmp_path / "ckpt", tmp_path / "trace.jsonl", tmp_path / "run.log"
    proc = start_logged(*run_args(ckpt, trace, MAX_STEPS), log=log)
    try:
        wait_for(lambda: sum(e["ev"] == "train" for e in read_trace(trace)) >= 3, 600, "3 train steps", proc)
        (victim,) = actor_pids(proc.pid, "GenerationWorker")
        os.kill(victim, signal.SIGKILL)
        run = finish(proc, 600, "the run with a killed generation worker")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    out = log.read_text()
    assert run.rc == 0, out[-4000:]
    assert f"done: step {MAX_STEPS}" in out
    assert "fault generation.worker: recovered" in out, out[-3000:]

    events = read_trace(trace)
    assert sum(e["ev"] == "start" for e in events) == 1, "recovered in-job: one start"
    (restart,) = [e for e in events if e["ev"] == "generation_restart"]
    (given,) = [e for e in events if e["ev"] == "give_back"]
    at = events.index(restart)
    trained_before = [e["step"] for e in events[:at] if e["ev"] == "train"]
    assert restart["version"] >= max(trained_before), "the new worker got the weights training was at"
    assert not generation_restart_problems(events)
    issued_after = [p for e in events[at:] if e["ev"] == "issue" for p in e["prompts"]]
    assert set(given["prompts"]) <= set(issued_after), "every given-back prompt is issued again"
    trained = [p for e in events if e["ev"] == "train" for p in e["prompts"]]
    dropped = [p for e in events if e["ev"] == "drop_stale" for p in e["prompts"]]
    repeats = [p for p, n in Counter(trained + dropped).items() if n > 1]
    assert not repeats, f"prompts trained twice: {repeats}"
    issued = [p for e in events if e["ev"] == "issue" for p in e["prompts"]]
    once = Counter(issued)
    assert all(once[p] == 2 for p in given["prompts"]), "a given-back prompt is issued exactly once more"
    assert all(n == 1 for p, n in once.items() if p not in given["prompts"])

    (fault,) = read_history(ckpt / "logs").events_named("fault")
    assert fault.data["fault"] == "generation.worker" and fault.data["outcome"] == "recovered"
    assert fault.data["prompts_lost"] == fault.data["prompts_duplicated"] == 0
    assert fault.data["rollouts_regenerated"] == len(given["prompts"]) * 8
    assert fault.data["recovery_s"] > 0

    from tests.support.proc import sc_app

    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    assert verify.rc == 0, verify.out
