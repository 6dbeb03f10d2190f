"""One run, five SIGKILLs by PID (real CLI, Ray, TransferQueue): the controller actor, a generation worker, a trainer
rank, a TransferQueue storage unit and the TransferQueue controller, in turn, each once the run has recovered from
the one before and trained on. The run must end at max_steps with exit 0 and never exit in between.

* Each restore is warm (``run.in_job_restore: warm``): only what died starts again — checked by PID, before each kill
  and once the job trains again: the controller actor's death restarts it alone (the trainer, the engine and
  TransferQueue keep their processes); a trainer rank's gives its place to the run's spare (``trainer.spare_ranks=1``:
  a process started and warmed up before the kill — the test waits for its warm-up —, kept as the new rank) and starts
  a new spare, nothing else (the engine, the controller actor and TransferQueue are reset in place); a storage unit's
  rebuilds the data plane alone. A rank without a spare, started anew, is what test_hung_actor, test_node_loss and
  test_node_local_disks restore. The last one's (the TransferQueue controller's) warm reset is made to fail once it
  has started a new TransferQueue (``SC_APP_FAULT_AT=restore.warm.started``): the fallback, the full rebuild, runs,
  every process of the job is new and none of the failed reset's is left; the spare not promoted outlives it. Each
  ``fault`` event names its path and what it restarted and reset.

* The generation worker is replaced in the job without a restore (no new trace ``start``): the dead call's prompts
  go back to the loader once (``give_back``) and are issued and trained again, none twice and none skipped; the new
  worker got the weights version training was at before its first generate call; the fault is a printed line and a
  run-log ``fault`` event with its cost (the rollouts regenerated).
* Each of the other four is restored in the job: the driver fences the old job (the lease moves one epoch on), plans
  again and resets the job from the newest bundle; the steps trained since that bundle are trained again.
  Checked: a ``fault`` event per kill (what died, restored step, steps to redo) and a restart of the trace at exactly
  the restored step each time; the surviving lineage trains every step once and no prompt twice; every save after a
  restore passed its inventory check (no ``SAVE FAILED``); the lease epoch moved on once per restore; the goodput
  ledger counts the recoveries and redone steps in the one attempt.
* The chaos bench's verdicts (``bench/chaos_in_job.py``) hold for the run; every bundle verifies.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_in_job import Shape, check_faults, check_trace
from sc_app.observe.goodput import ledger
from sc_app.observe.reader import read_history
from tests.support.cli import InProcess
from tests.support.proc import actor_pids, finish, read_trace, run_args, start_logged, trained_lineage, wait_for
from tests.support.restart import attempts_of, generation_restart_problems, kept_history

pytestmark = pytest.mark.slow

MAX_STEPS = 120  # five kills, each after 3 steps of its part; steps take ~0.07 s and a kill lands up to a poll
# (0.25 s, and reading the process tree) later, so each part may run ~8 steps: 24 ran out before the fifth kill once
# the warm restores got faster; the trainer rank's part also waits for the new spare's process (~2.5 s quiet: ~26
# steps), and 64 ran out there
GROUP_SIZE = 8
GENERATION = ("GenerationWorker", "generation.worker")
CONTROLLER = ("SingleControllerActor", "controller")
RESTORED = [  # (actor class, FaultRecord kind), killed in this order after the generation worker
    ("TrainerWorker", "trainer.worker"),
    ("SimpleStorageUnit", "data_plane.storage"),
    ("TransferQueueController", "data_plane.controller"),
]
CHAOS_NAMES = {
    "controller": CONTROLLER,
    "generation": GENERATION,
    "trainer": RESTORED[0],
    "storage": RESTORED[1],
    "tq-controller": RESTORED[2],
}
SPARE = "TrainerSpare"
ACTORS = [
    "SingleControllerActor",
    "GenerationWorker",
    "TrainerWorker",
    SPARE,
    "SimpleStorageUnit",
    "TransferQueueController",
]
DATA_PLANE = {"SimpleStorageUnit", "TransferQueueController"}


@dataclass
class FourKills:
    ckpt: Path
    trace: Path
    rc: int
    out: str
    events: list[dict[str, Any]]
    faults: list[Any]  # the run log's fault events
    pids: list[tuple[str, dict[str, list[int]], dict[str, list[int]]]]  # (killed class, PIDs before, after)


def trains_after(trace: Path, start: int, ev: str = "start") -> int:
    """Train steps in start number ``start`` (0-based) of the trace after its first ``ev`` event."""
    parts = attempts_of(read_trace(trace))
    if len(parts) <= start:
        return 0
    part = parts[start]
    at = next((n for n, e in enumerate(part) if e["ev"] == ev), None)
    return 0 if at is None else sum(e["ev"] == "train" for e in part[at:])


def pids_of(proc: Any) -> dict[str, list[int]]:
    return {actor: sorted(actor_pids(proc.pid, actor)) for actor in ACTORS}


def spare_warmed_up(proc: Any) -> bool:
    """The run's one spare has finished its warm-up: its process title is the idle ``ray::TrainerSpare`` (not
    ``...__init__`` or ``...warm_up``), twice 0.5 s apart (Ray's title between the two calls is idle for an instant)."""

    def idle() -> bool:
        pids = actor_pids(proc.pid, SPARE)
        return (
            len(pids) == 1 and Path(f"/proc/{pids[0]}/cmdline").read_bytes().rstrip(b"\0") == f"ray::{SPARE}".encode()
        )

    if not idle():
        return False
    time.sleep(0.5)
    return idle()


def kill_one(proc: Any, actor: str) -> dict[str, list[int]]:
    """SIGKILL the one process of ``actor``; returns the job's PIDs just before."""
    before = pids_of(proc)
    (victim,) = before[actor]
    os.kill(victim, signal.SIGKILL)
    return before


@pytest.fixture(scope="module")
def four_kills(tmp_path_factory: pytest.TempPathFactory) -> FourKills:
    base = tmp_path_factory.mktemp("in_job")
    ckpt, trace, log = base / "ckpt", base / "trace.jsonl", base / "run.log"
    restores = ["--set", f"run.max_in_job_restores={1 + len(RESTORED)}"]  # the controller actor's and RESTORED's
    # every bundle kept: a controller killed between a publish and its trace line leaves the bundle as the only
    # record that it was the newest, which the trace check reads at the end
    restores += ["--set", f"checkpoint.keep={MAX_STEPS}", "--set", "trainer.spare_ranks=1"]
    # the last restore's warm reset fails (injected) once it started a new TransferQueue: the fallback, the full
    # rebuild, runs for real and must remove those actors too
    fallback = {"SC_APP_FAULT_AT": "restore.warm.started", "SC_APP_FAULT_ACTION": "raise", "SC_APP_FAULT_AFTER": "3"}
    proc = start_logged(*run_args(ckpt, trace, MAX_STEPS, *restores), log=log, env=fallback)
    pids: list[tuple[str, dict[str, list[int]], dict[str, list[int]]]] = []
    try:
        wait_for(lambda: trains_after(trace, 0) >= 3, 600, "3 train steps before killing the controller actor", proc)
        wait_for(lambda: len(actor_pids(proc.pid, SPARE)) == 1, 600, "the spare trainer rank's process", proc)
        before = kill_one(proc, CONTROLLER[0])
        wait_for(lambda: trains_after(trace, 1) >= 3, 600, "3 steps after its restore", proc, log=log)
        pids.append((CONTROLLER[0], before, pids_of(proc)))
        before = kill_one(proc, GENERATION[0])
        after = "2 train steps after the generation worker was replaced"
        wait_for(lambda: trains_after(trace, 1, "generation_restart") >= 2, 600, after, proc, log=log)
        pids.append((GENERATION[0], before, pids_of(proc)))
        for n, (actor, _) in enumerate(RESTORED, start=2):
            if actor == "TrainerWorker":  # a spare is handed out once warmed up: until then a new rank would start
                wait_for(lambda: spare_warmed_up(proc), 600, "the spare's warm-up", proc, log=log)
            before = kill_one(proc, actor)
            wait_for(lambda n=n: trains_after(trace, n) >= 3, 600, f"3 steps after killing {actor}", proc, log=log)
            if actor == "TrainerWorker":  # the spare took its place; the new spare's process, before the next kill
                wait_for(lambda: len(actor_pids(proc.pid, SPARE)) == 2, 600, "a new spare's process", proc, log=log)
            pids.append((actor, before, pids_of(proc)))
        run = finish(proc, 900, "the run with five kills")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    faults = list(read_history(ckpt / "logs").events_named("fault"))
    return FourKills(ckpt, trace, run.rc, log.read_text(), read_trace(trace), faults, pids)


def test_the_run_ends_at_max_steps_in_one_attempt(four_kills: FourKills) -> None:
    k = four_kills
    assert k.rc == 0, k.out[-4000:]
    assert f"done: step {MAX_STEPS}" in k.out and "SAVE FAILED" not in k.out, k.out[-4000:]
    kinds = [CONTROLLER[1], GENERATION[1]] + [kind for _, kind in RESTORED]
    assert [f.data["fault"] for f in k.faults] == kinds, k.out[-3000:]
    assert all(f.data["outcome"] == "recovered" for f in k.faults)
    assert all(f.data["prompts_lost"] == f.data["prompts_duplicated"] == 0 for f in k.faults)
    starts = [e for e in k.events if e["ev"] == "start"]
    assert len({s["run_id"] for s in starts}) == 1, "one attempt: restored in-job, not by a retry"
    money = ledger(read_history(k.ckpt / "logs"))
    assert len(money.attempts) == 1 and money.job_retries == 0
    assert money.seconds["recoveries"] > 0
    assert money.faults.steps_redone == sum(f.data["steps_redone"] for f in k.faults if "restored_step" in f.data)


def test_a_killed_generation_worker_is_replaced_without_a_restore(four_kills: FourKills) -> None:
    k = four_kills
    assert "fault generation.worker: recovered" in k.out, k.out[-3000:]
    first = attempts_of(k.events)[1]  # killed (and replaced) between the first restore and the second
    (restart,) = [e for e in k.events if e["ev"] == "generation_restart"]
    (given,) = [e for e in k.events if e["ev"] == "give_back"]
    assert restart in first and given in first, "replaced in-job: no new start between the kill and the restart"
    at = first.index(restart)
    trained_before = [e["step"] for e in first[:at] if e["ev"] == "train"]
    assert restart["version"] >= max(trained_before), "the new worker got the weights training was at"
    for part in attempts_of(k.events):
        assert not generation_restart_problems(part)
    issued_after = [p for e in first[at:] if e["ev"] == "issue" for p in e["prompts"]]
    assert set(given["prompts"]) <= set(issued_after), "every given-back prompt is issued again"
    once = Counter(p for e in first if e["ev"] == "issue" for p in e["prompts"])
    assert all(once[p] == 2 for p in given["prompts"]), "a given-back prompt is issued exactly once more"
    assert all(n == 1 for p, n in once.items() if p not in given["prompts"])

    fault = k.faults[1]
    assert fault.data["fault"] == GENERATION[1] and fault.data["outcome"] == "recovered"
    assert fault.data["prompts_lost"] == fault.data["prompts_duplicated"] == 0
    assert fault.data["rollouts_regenerated"] == len(given["prompts"]) * GROUP_SIZE
    assert fault.data["recovery_s"] > 0


def test_each_restore_restarts_the_trace_at_the_restored_bundle(four_kills: FourKills) -> None:
    k = four_kills
    restores = [f for f in k.faults if "restored_step" in f.data]
    assert len(restores) == 1 + len(RESTORED)
    for f in restores:
        assert f.data["steps_redone"] == f.step - f.data["restored_step"] >= 0
        assert f.data["recovery_s"] > 0
    starts = [e for e in k.events if e["ev"] == "start"]
    assert [s["step"] for s in starts] == [0] + [f.data["restored_step"] for f in restores], "restarted at the bundle"
    lease = json.loads((k.ckpt / "LEASE").read_text())
    assert lease["epoch"] == 1 + len(restores), "each restore fenced the old job: one epoch on"
    assert lease["released"]["outcome"] == "done"


def test_every_step_trained_once_and_no_prompt_twice(four_kills: FourKills) -> None:
    k = four_kills
    lineage = trained_lineage(k.events)
    assert sorted(lineage) == list(range(1, MAX_STEPS + 1))
    repeats = [p for p, n in Counter(p for ps in lineage.values() for p in ps).items() if n > 1]
    assert not repeats, f"prompts trained twice in the surviving lineage: {repeats}"
    trained, dropped = kept_history(k.events)
    repeats = [p for p, n in Counter(trained + dropped).items() if n > 1]
    assert not repeats, f"prompts trained or dropped twice in the kept history: {repeats}"


def test_the_chaos_verdicts_hold_and_every_bundle_verifies(cli: InProcess, four_kills: FourKills) -> None:
    k = four_kills
    done = [f"{kind}@0" for kind in CHAOS_NAMES]
    assert not check_faults([f.data for f in k.faults], Shape(MAX_STEPS, 5, list(CHAOS_NAMES)), done)
    assert not check_trace(k.ckpt, k.events)
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(k.ckpt))
    assert verify.rc == 0, verify.out


def test_the_console_holds_sc_apps_lines_only(four_kills: FourKills) -> None:
    """Issue 31, class K: each kill makes Ray's driver print ``(raylet) A worker died ...`` (a paragraph on one
    line) and TransferQueue warn at teardown; both belong in ``libraries.log``, not among the fault lines."""
    from tests.support.console import foreign_lines

    assert not foreign_lines(four_kills.out), foreign_lines(four_kills.out)[:3]
    assert "ray.raylet: A worker died" in (four_kills.ckpt / "logs" / "libraries.log").read_text()


def test_only_what_died_started_again(four_kills: FourKills) -> None:
    """Issue 29: a fault costs what died. By PID, before each kill and once the job trained again; the last kill's
    warm reset was made to fail, so the full rebuild ran (every actor started again) — the fallback."""
    k = four_kills
    *warm, (last, before_full, after_full) = k.pids
    restores = [f.data for f in k.faults if "restored_step" in f.data]
    by_kind = {f["fault"]: f for f in restores}
    for killed, before, after in warm:
        # TransferQueue cannot outlive its controller or a unit: the data plane alone is started again; a dead
        # trainer rank's place goes to the spare (no TrainerWorker left), and a new spare starts
        restarted = DATA_PLANE if killed in DATA_PLANE else {killed, SPARE} if killed == "TrainerWorker" else {killed}
        for actor in ACTORS:
            changed = before[actor] != after[actor]
            assert changed == (actor in restarted), (
                f"after {killed} was killed, {actor} {'restarted' if changed else 'kept'}: {before} -> {after}"
            )
    (spare,) = next(before[SPARE] for killed, before, _ in warm if killed == "TrainerWorker")
    after = next(after for killed, _, after in warm if killed == "TrainerWorker")
    assert after["TrainerWorker"] == [] and spare in after[SPARE] and len(after[SPARE]) == 2, after
    took = f"trainer rank 0 (spare pid {spare} took its place)"
    assert by_kind["trainer.worker"]["restarted"] == [took], "the spare's process is the rank now"
    assert last == RESTORED[-1][0]
    # the full rebuild: every actor of the job started again, the promoted spare (the rank) with them; the spare
    # that was not promoted lives on (the pool outlives a rebuild), and nothing the failed warm reset started is left
    job = [a for a in ACTORS if a != SPARE]
    assert all(before_full[a] != after_full[a] for a in job), f"full rebuild: {before_full} -> {after_full}"
    (kept,) = set(before_full[SPARE]) - {spare}
    assert after_full[SPARE] == [kept] and len(after_full["TrainerWorker"]) == 1, (spare, after_full)
    assert {a: len(p) for a, p in after_full.items() if a in job and a != "TrainerWorker"} == {
        a: len(p) for a, p in before_full.items() if a in job and a != "TrainerWorker"
    }, after_full
    assert [f["path"] for f in restores[:-1]] == ["warm"] * (len(restores) - 1)
    assert restores[-1]["path"].startswith("full (warm reset failed: InjectedFault"), restores[-1]["path"]
    assert restores[-1]["outcome"] == "recovered"
    assert {"generation worker 0", "the controller actor"} <= set(by_kind["trainer.worker"]["reset"])
    assert by_kind["controller"]["restarted"] == ["the controller actor"]
    assert {"trainer rank 0", "generation worker 0"} <= set(by_kind["controller"]["reset"])
    storage = by_kind["data_plane.storage"]
    assert [r for r in storage["restarted"] if r.startswith("TransferQueue")], storage
    assert {"trainer rank 0", "generation worker 0", "the controller actor"} <= set(storage["reset"])
    for f in restores:
        assert {"detection", "fencing", "reload"} <= set(f["phase_s"]), f["phase_s"]
