"""A trainer rank, a TransferQueue storage unit and the TransferQueue controller, each SIGKILLed by PID mid-run
(saves going on), are restored in the same job: one process, exit 0 (real CLI, Ray, TransferQueue).

After each kill the driver tears the job down, fences it (the lease moves one epoch on), plans again and sets it
up from the newest bundle; the steps trained since that bundle are trained again. Checked: the run ends at
max_steps with exit 0 and never exits in between; three ``fault`` events (what died, restored step, steps to
redo) and a restart of the trace at exactly the restored step each time; the surviving lineage trains every step
once and no prompt twice; every save after a restore passed its inventory check (no ``SAVE FAILED``); the lease
epoch moved on once per restore; every bundle verifies; the goodput ledger counts the recoveries and redone steps
in the one attempt.
"""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from sc_app.observe.goodput import ledger
from sc_app.observe.reader import read_history
from tests.support.proc import actor_pids, finish, read_trace, run_args, sc_app, start_logged, trained_lineage, wait_for

pytestmark = pytest.mark.slow

MAX_STEPS = 12
VICTIMS = [  # (actor class, FaultRecord kind), killed in this order
    ("TrainerWorker", "trainer.worker"),
    ("SimpleStorageUnit", "data_plane.storage"),
    ("TransferQueueController", "data_plane.controller"),
]


def test_dead_trainer_storage_unit_and_tq_controller_are_restored_in_job(tmp_path: Path) -> None:
    ckpt, trace, log = tmp_path / "ckpt", tmp_path / "trace.jsonl", tmp_path / "run.log"
    proc = start_logged(*run_args(ckpt, trace, MAX_STEPS), log=log)
    try:
        for n, (actor, _) in enumerate(VICTIMS):
            starts = n + 1

            def trained_since_start(k: int = starts) -> int:
                events = read_trace(trace)
                at = [i for i, e in enumerate(events) if e["ev"] == "start"]
                return 0 if len(at) < k else sum(e["ev"] == "train" for e in events[at[k - 1] :])

            wait_for(lambda: trained_since_start() >= 3, 600, f"3 steps before killing {actor}", proc)
            (victim,) = actor_pids(proc.pid, actor)
            os.kill(victim, signal.SIGKILL)
        run = finish(proc, 900, "the run with three kills")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    out = log.read_text()
    assert run.rc == 0, out[-4000:]
    assert f"done: step {MAX_STEPS}" in out and "SAVE FAILED" not in out, out[-4000:]

    faults = read_history(ckpt / "logs").events_named("fault")
    assert [f.data["fault"] for f in faults] == [kind for _, kind in VICTIMS], out[-3000:]
    assert all(f.data["outcome"] == "recovered" for f in faults)
    assert all(f.data["prompts_lost"] == f.data["prompts_duplicated"] == 0 for f in faults)
    for f in faults:
        assert f.data["steps_redone"] == f.step - f.data["restored_step"] >= 0
        assert f.data["recovery_s"] > 0

    events = read_trace(trace)
    starts = [e for e in events if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0] + [f.data["restored_step"] for f in faults], "restarted at the bundle"
    assert len({s["run_id"] for s in starts}) == 1, "one attempt: restored in-job, not by a retry"
    lineage = trained_lineage(events)
    assert sorted(lineage) == list(range(1, MAX_STEPS + 1))
    repeats = [p for p, k in Counter(p for ps in lineage.values() for p in ps).items() if k > 1]
    assert not repeats, f"prompts trained twice in the surviving lineage: {repeats}"

    lease = json.loads((ckpt / "LEASE").read_text())
    assert lease["epoch"] == 1 + len(VICTIMS), "each restore fenced the torn-down job: one epoch on"
    assert lease["released"]["outcome"] == "done"

    money = ledger(read_history(ckpt / "logs"))
    assert len(money.attempts) == 1 and money.job_retries == 0
    assert money.seconds["recoveries"] > 0 and money.faults.steps_redone == sum(f.data["steps_redone"] for f in faults)

    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    assert verify.rc == 0, verify.out
