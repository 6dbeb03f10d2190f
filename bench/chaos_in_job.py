"""In-job chaos (``bench/chaos.py --in-job``): faults a running job must survive without its process exiting.

Each iteration is one real ``sc-app run`` (tiny backend, embedded Ray + TransferQueue, a bundle every 2 steps) on a
fresh checkpoint directory. While it trains, faults are injected at random moments (random train steps, then a
random delay): SIGKILL, by PID, of one of the run's own actor processes — Ray titles them ``ray::<ClassName>`` —
picked at random among those of the kind (``generation``: a ``GenerationWorker``; ``trainer``: a ``TrainerWorker``
rank; ``storage``: a TransferQueue ``SimpleStorageUnit``; ``tq-controller``: the ``TransferQueueController``;
``controller``: sc-app's ``SingleControllerActor``), one at a time, each after the previous one's ``fault`` event;
and ``dp``: data-plane calls that raise after writing half their rows (``SC_APP_FAULT_AT=dp.put,dp.write,dp.clear``,
``sc_app/faults.py``, a random schedule per run). Pass, per iteration:
  * the run exits 0 at its last step, having never exited in between: one attempt in ``metrics.jsonl``;
  * every kill has a ``fault`` event of its kind, every ``fault`` event is ``recovered`` with no prompt lost or
    duplicated, and ``dp`` fired at least once when chosen;
  * from the trace (``tests/support/restart.py``, the same rules for a process restart and an in-job restore):
    every prompt the loader handed out was trained exactly once in the history the run kept, or dropped as stale,
    or is still held by the newest bundle; every restore (a new ``start`` event) restored the newest bundle saved
    before it with exactly the rows its index lists (``bench/kill_stress.check_resumed``); every generation restart
    served the current weights; ``steps_redone`` of the faults adds up to the steps trained again;
  * bundles verify (``sc-app ckpt verify``) and each holds exactly the rows its index lists
    (``bench/kill_stress.check_after_preflight``).
Prints one line per iteration, then: iterations, faults by kind, goodput per run, recovery seconds median/max, and
the goodput of one fault-free run of the same shape.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bench.kill_stress import check_after_preflight, check_resumed, steps
from sc_app.observe.goodput import ledger
from sc_app.observe.reader import read_history
from tests.support.proc import actor_pids, kill_session, read_trace, sc_app, start_logged, wait_for
from tests.support.restart import attempts_of, generation_restart_problems, prompt_problems

KILLS = {  # kind -> (the actor class in its process title, the fault event kind its recovery reports)
    "generation": ("GenerationWorker", "generation.worker"),
    "trainer": ("TrainerWorker", "trainer.worker"),
    "storage": ("SimpleStorageUnit", "data_plane.storage"),
    "tq-controller": ("TransferQueueController", "data_plane.controller"),
    "controller": ("SingleControllerActor", "controller"),
}
KINDS = [*KILLS, "dp"]
DP_POINTS = "dp.put,dp.write,dp.clear"
RUN_TIMEOUT = 1200.0  # start-up on a loaded 2-core machine alone can take minutes
RECOVERY_TIMEOUT = 600.0


@dataclass
class Shape:
    max_steps: int
    faults: int  # kills per run
    kinds: list[str]
    sets: list[str] = field(default_factory=list)  # extra --set KEY=VALUE for every run
    each: bool = False  # kill each kill kind of ``kinds`` once, in their order (``faults`` ignored), not at random


@dataclass
class Outcome:
    what: str
    problems: list[str]
    faults: list[dict[str, Any]]  # the run log's fault events
    goodput: float | None
    wall_s: float


def run_args(root: Path, trace: Path, shape: Shape) -> list[str]:
    sets = ["checkpoint.save_period=2", "checkpoint.keep=1000", f"run.trace_file={trace}", *shape.sets]
    return ["run", "--checkpoint-dir", str(root), "--max-steps", str(shape.max_steps)] + [
        a for kv in sets for a in ("--set", kv)
    ]


def dp_env(rng: random.Random) -> dict[str, str]:
    """A random schedule of failing data-plane calls: each point fails after a few hits, then now and again."""
    return {
        "SC_APP_FAULT_AT": DP_POINTS,
        "SC_APP_FAULT_ACTION": "raise",
        "SC_APP_FAULT_AFTER": str(rng.randint(1, 6)),
        "SC_APP_FAULT_EVERY": str(rng.randint(2, 8)),
        "SC_APP_FAULT_TIMES": str(rng.randint(1, 3)),
    }


def trained_step(trace: Path) -> int:
    return max((e["step"] for e in read_trace(trace) if e["ev"] == "train"), default=0)


def fault_events(root: Path) -> list[dict[str, Any]]:
    try:
        return [e.data for e in read_history(root / "logs").events_named("fault")]
    except FileNotFoundError:
        return []


def plan_kills(rng: random.Random, shape: Shape) -> list[tuple[int, float, str]]:
    """(train step to wait for, extra delay s, kind) of every kill, in step order, within the first two thirds of
    the run (from step 3): a recovery then has room to show before the run ends. ``shape.each``: one kill of every
    kind, in the order given, spread evenly over that span (a kind random draws may never pick is measured)."""
    kinds = [k for k in shape.kinds if k in KILLS]
    if not kinds:
        return []
    last = max(3, 2 * shape.max_steps // 3)
    if shape.each:
        return [(3 + n * (last - 3) // len(kinds), rng.uniform(0.0, 1.5), k) for n, k in enumerate(kinds)]
    at = sorted(rng.randint(3, last) for _ in range(shape.faults))
    return [(s, rng.uniform(0.0, 1.5), rng.choice(kinds)) for s in at]


def faults_seen(root: Path, log: Path, fault: str) -> int:
    """``fault`` faults the run reported: its printed ``fault <kind>:`` lines (at once) or its run log's ``fault``
    events (written behind), whichever shows more."""
    printed = log.read_text(errors="replace").count(f"  fault {fault}: ")
    return max(printed, sum(f["fault"] == fault for f in fault_events(root)))


SPARE_TOOK = re.compile(r"\(spare pid (\d+) took its place\)")


def promoted_spares(proc: subprocess.Popen[str], root: Path) -> list[int]:
    """The processes of spares that took a dead rank's place (``trainer.spare_ranks``; the fault events name them)
    and live on as ranks, titled ``ray::TrainerSpare`` still: a spare not promoted is no rank to kill."""
    live = set(actor_pids(proc.pid, "TrainerSpare"))
    named = {
        int(m.group(1)) for f in fault_events(root) for r in f.get("restarted", []) for m in SPARE_TOOK.finditer(r)
    }
    return sorted(named & live)


def inject(proc: subprocess.Popen[str], base: Path, shape: Shape, rng: random.Random, done: list[str]) -> None:
    """Kill per ``plan_kills``, each once the run reached its step, and wait for its recovery before the next; a
    kill due when the run is within 5 steps of its end is left out (``kind@late``): the run may not notice it.
    Appends what it did to ``done`` as it goes."""
    root, trace, log = base / "ckpt", base / "trace.jsonl", base / "run.log"
    for step, delay, kind in plan_kills(rng, shape):
        wait_for(lambda s=step: trained_step(trace) >= s, RUN_TIMEOUT, f"train step {step}", proc)
        time.sleep(delay)
        if trained_step(trace) > shape.max_steps - 5:
            done.append(f"{kind}@late")
            continue
        title, fault = KILLS[kind]
        pids = actor_pids(proc.pid, title) + (promoted_spares(proc, root) if kind == "trainer" else [])
        if not pids:
            raise AssertionError(f"no ray::{title} process in the run's session to kill (after {done})")
        before = faults_seen(root, log, fault)
        os.kill(rng.choice(pids), signal.SIGKILL)
        done.append(f"{kind}@{trained_step(trace)}")
        wait_for(
            lambda fault=fault, before=before: faults_seen(root, log, fault) > before,
            RECOVERY_TIMEOUT,
            f"a 'fault {fault}' line after killing ray::{title} (kills: {done})",
            proc,
        )


def one_run(i: int, rng: random.Random, work: Path, shape: Shape) -> Outcome:
    """One ``sc-app run`` with the faults of ``shape`` (none when it has no kinds), checked."""
    base = work / f"run{i}"
    base.mkdir(parents=True)
    root, trace, log = base / "ckpt", base / "trace.jsonl", base / "run.log"
    env = dp_env(rng) if "dp" in shape.kinds else {}
    started = time.monotonic()
    proc = start_logged(*run_args(root, trace, shape), log=log, env=env)
    problems: list[str] = []
    done: list[str] = []
    try:
        inject(proc, base, shape, rng, done)
        code = proc.wait(timeout=RUN_TIMEOUT)
        if code != 0:
            problems.append(f"the run exited {code}: {log.read_text()[-600:]}")
    except (AssertionError, subprocess.TimeoutExpired) as exc:
        problems.append(f"{str(exc).splitlines()[0]}; last output: {log.read_text()[-600:]}")
    finally:
        kill_session(proc.pid)
    wall = time.monotonic() - started
    if not problems:
        problems += check_run(root, trace, log, shape, done)
    faults = fault_events(root)
    what = ",".join(done) + (f" dp({env['SC_APP_FAULT_AFTER']}/{env['SC_APP_FAULT_EVERY']})" if env else "")
    return Outcome(what or "no faults", problems, faults, run_goodput(root), wall)


def run_goodput(root: Path) -> float | None:
    try:
        return ledger(read_history(root / "logs")).goodput
    except FileNotFoundError:
        return None


def check_run(root: Path, trace: Path, log: Path, shape: Shape, done: list[str]) -> list[str]:
    """Every invariant of the module docstring for one finished run."""
    problems: list[str] = []
    out = log.read_text()
    if f"done: step {shape.max_steps}" not in out:
        problems.append(f"no 'done: step {shape.max_steps}' line")
    attempts = read_history(root / "logs").attempts()
    if len(attempts) != 1 or attempts[0].exit_code != 0:
        problems.append(f"{len(attempts)} attempts in metrics.jsonl (exit codes {[a.exit_code for a in attempts]})")
    problems += check_faults(fault_events(root), shape, done)
    problems += check_trace(root, read_trace(trace))
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(root), timeout=300)
    if verify.rc != 0:
        problems.append(f"ckpt verify exited {verify.rc}: {verify.out[-300:]}")
    problems += check_after_preflight(root)[1]
    return problems


def check_faults(faults: list[dict[str, Any]], shape: Shape, done: list[str]) -> list[str]:
    problems = [
        f"fault {f['fault']}: {f['outcome']} ({f.get('error', '')})"
        for f in faults
        if f["outcome"] not in ("recovered", "interrupted")  # interrupted: another death's restore covered it
    ]
    problems += [
        f"fault {f['fault']} lost or duplicated prompts"
        for f in faults
        if f.get("prompts_lost") or f.get("prompts_duplicated")
    ]
    landed = [d.split("@")[0] for d in done if not d.endswith("@late")]
    for kind in set(landed):
        killed = landed.count(kind)
        seen = sum(f["fault"] == KILLS[kind][1] for f in faults)
        if seen < killed:
            problems.append(f"{killed} kills of {kind}, {seen} '{KILLS[kind][1]}' fault events")
    if "dp" in shape.kinds and not any(
        f["fault"].startswith("data_plane.") and f["fault"] not in ("data_plane.storage", "data_plane.controller")
        for f in faults
    ):
        problems.append("dp chosen but no data-plane call failed (raise SC_APP_FAULT schedule or --max-steps)")
    return problems


def check_trace(root: Path, events: list[dict[str, Any]]) -> list[str]:
    """Prompts, restores and generation restarts, from the run's trace (see the module docstring)."""
    problems: list[str] = []
    parts = attempts_of(events)
    trace = root.parent / "trace.jsonl"
    for n in range(1, len(parts)):
        newest = max((e["step"] for part in parts[:n] for e in part if e["ev"] == "save"), default=0)
        if parts[n][0]["step"] > newest and (root / f"step_{parts[n][0]['step']}").is_dir():
            newest = parts[n][0]["step"]  # published, its trace line cut by the fault: still the newest bundle
        problems += check_resumed(root, trace, n, newest)
    redone = sum(
        max((e["step"] for e in part if e["ev"] == "train"), default=nxt[0]["step"]) - nxt[0]["step"]
        for part, nxt in itertools.pairwise(parts)
    )
    claimed = sum(int(f.get("steps_redone") or 0) for f in fault_events(root))
    if claimed != redone:
        problems.append(f"fault events claim {claimed} steps redone, the trace shows {redone}")
    for part in parts:
        problems += generation_restart_problems(part)
    newest = steps(root)
    if not newest:
        return [*problems, "no bundle"]
    bundle = root / f"step_{newest[-1]}"
    loader = torch.load(bundle / "train_dataloader.pt", weights_only=True)
    sidecar = torch.load(bundle / "replay_buffer_metadata.pt", weights_only=True)
    held = {g["prompt_index"] for g in sidecar["groups"].values()} | set(loader["reissue"])
    return problems + prompt_problems(events, loader["next_index"], held)


def summary(outcomes: list[Outcome], baseline: Outcome | None) -> dict[str, Any]:
    faults = [f for o in outcomes for f in o.faults]
    recovery = [float(f["recovery_s"]) for f in faults if isinstance(f.get("recovery_s"), int | float)]
    by_kind: dict[str, int] = {}
    for f in faults:
        key = f"{f['fault']} {f['outcome']}"
        by_kind[key] = by_kind.get(key, 0) + 1
    return {
        "iterations": len(outcomes),
        "failed": sum(bool(o.problems) for o in outcomes),
        "faults": len(faults),
        "faults_by_kind": dict(sorted(by_kind.items())),
        "goodput_per_run": [None if o.goodput is None else round(o.goodput, 4) for o in outcomes],
        "wall_s_per_run": [round(o.wall_s, 1) for o in outcomes],
        "recovery_s_by_fault": recovery_by_fault(faults),
        "recovery_s_median": round(statistics.median(recovery), 3) if recovery else None,
        "recovery_s_max": round(max(recovery), 3) if recovery else None,
        "fault_free_goodput": None if baseline is None or baseline.goodput is None else round(baseline.goodput, 4),
        "fault_free_wall_s": None if baseline is None else round(baseline.wall_s, 1),
    }


def recovery_by_fault(faults: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Recovery seconds median/max per fault kind (a data-plane retry and a worker restart differ 100-fold)."""
    by: dict[str, list[float]] = {}
    for f in faults:
        if isinstance(f.get("recovery_s"), int | float):
            by.setdefault(f["fault"], []).append(float(f["recovery_s"]))
    return {k: {"median": round(statistics.median(v), 3), "max": round(max(v), 3)} for k, v in sorted(by.items())}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(iterations: int, seed: int, work: Path, shape: Shape, baseline: bool) -> int:
    unknown = [k for k in shape.kinds if k not in KINDS]
    if unknown:
        print(f"chaos: unknown --kinds {unknown}; choose from {','.join(KINDS)}")
        return 2
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    for i in range(iterations):
        o = one_run(i, rng, work, shape)
        outcomes.append(o)
        verdict = "ok" if not o.problems else "FAIL " + "; ".join(o.problems)
        kinds = sorted({f["fault"] for f in o.faults})
        print(
            f"[{i + 1:>3}/{iterations}] {o.what}: {len(o.faults)} faults {kinds}, goodput {pct(o.goodput)} of "
            f"{o.wall_s:.0f}s: {verdict}",
            flush=True,
        )
    free = None
    if baseline:
        free = one_run(iterations, rng, work, Shape(shape.max_steps, 0, [], shape.sets))
        verdict = "ok" if not free.problems else "FAIL " + "; ".join(free.problems)
        print(f"[fault-free] goodput {pct(free.goodput)} of {free.wall_s:.0f}s: {verdict}", flush=True)
    result = summary(outcomes, free)
    print(json.dumps(result))
    print(
        f"{iterations - result['failed']} passed, {result['failed']} failed; {result['faults']} faults "
        f"{result['faults_by_kind']}; recovery median {result['recovery_s_median']}s max {result['recovery_s_max']}s; "
        f"goodput {', '.join(pct(g) for g in result['goodput_per_run'])} "
        f"(fault-free {pct(result['fault_free_goodput'])})"
    )
    return 1 if result["failed"] or (free is not None and free.problems) else 0
