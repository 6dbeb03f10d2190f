#!/usr/bin/env python3
"""In-job restores on the hf backend with each generation engine and each restore path, side by side (issue 29).

Usage (repo root):  .venv/bin/python bench/in_job_engines.py [--engine hf vllm] [--restore warm full]
                        [--kinds trainer,storage,tq-controller,controller] [--dir DIR] [--out FILE.json]

Per restore path and engine, one real ``sc-app run`` (``model.backend=hf``: a tiny Llama built here, head_dim 64
for vLLM's CPU attention; a JSONL task, a user reward; two FSDP trainer ranks, one generation worker, a bundle every
2 steps) in which each kind of ``--kinds`` is SIGKILLed by PID once, in that order, each after 3 steps trained since
the previous restore (``trainer``: the last ``TrainerWorker`` rank; ``storage``: a ``SimpleStorageUnit``;
``tq-controller``: the ``TransferQueueController``; ``controller``: the ``SingleControllerActor``) — none of them
an engine's fault. Per restore it measures:
  * **engine starts**: ``GenerationWorker`` processes after the restore that were not there before it (the engine
    runs in its worker's process, so a new process is a new engine start); the fault event's ``restarted`` must
    agree;
  * **resume → first token**: from the restored job's ``start`` (trace event) to its first ``rollout`` (a generate
    call served: its tokens), and **kill → first token** (the whole outage);
  * the restore's seconds (the fault event's ``recovery_s``) and the path that ran.
Pass per run = exit 0 at its last step, one ``recovered`` in-job restore per kill with no prompt lost or trained
twice, every bundle verifies. Then the table and the targets' verdicts: 0 engine starts in warm restores of these
faults; vLLM's resume → first token ≤ 2x HF's (medians, warm). Not in the default suite: each run is a model load
and, for vLLM, one engine start per start (more with ``full``): minutes here. ``tests/e2e/test_in_job_restore.py``
is the suite's proof (tiny backend, PIDs kept).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_in_job import KILLS, faults_seen, pct, run_goodput
from bench.restore_figures import first_rollout_after, first_rollouts, median, ratio_verdict
from sc_app.observe.reader import read_history
from tests.support.hf import ARITHMETIC, hf_world, make_model_dir
from tests.support.proc import actor_pids, finish, read_trace, sc_app, start_logged, wait_for
from tests.support.vllm_host import TINY_LLAMA

REWARD = (
    "from sc_app.rl.hf.rewards import numeric_match\n"
    "def score(*, prompt, completion, answer):\n"
    "    return numeric_match(prompt=prompt, completion=completion, answer=answer)\n"
)
STEPS_BETWEEN = 3  # train steps after a (re)start before the next kill
TIMEOUT = 1200.0  # a start or a full restore with a vLLM engine on a loaded 2-core machine


@dataclass
class Restore:
    kind: str
    fault: str = ""
    path: str = ""
    recovery_s: float | None = None
    engine_starts: int = 0  # GenerationWorker processes new after the restore
    named_restarted: list[str] = field(default_factory=list)  # the fault event's ``restarted``
    resume_to_first_token_s: float | None = None
    kill_to_first_token_s: float | None = None


@dataclass
class EngineRun:
    engine: str
    path: str
    restores: list[Restore]
    problems: list[str]
    wall_s: float
    load_after: float
    goodput: float | None = None  # the run's ledger (``sc-app report``)


def steps_since_start(trace: Path) -> int:
    """Train events since the newest ``start`` (the run's or a restore's)."""
    n = 0
    for e in read_trace(trace):
        n = 0 if e["ev"] == "start" else n + (e["ev"] == "train")
    return n


def kill_each(proc: Any, world: Any, log: Path, kinds: list[str]) -> tuple[list[Restore], list[float]]:
    """Kill each kind once (see the module docstring) and wait for its fault line; the restores and kill times."""
    restores, kills = [], []
    for kind in kinds:
        wait_for(lambda: steps_since_start(world.trace) >= STEPS_BETWEEN, TIMEOUT, f"steps before {kind}", proc)
        title, fault = KILLS[kind]
        engines_before = set(actor_pids(proc.pid, "GenerationWorker"))
        before = faults_seen(world.ckpt, log, fault)
        os.kill(actor_pids(proc.pid, title)[-1], signal.SIGKILL)
        kills.append(time.time())
        wait_for(lambda f=fault, b=before: faults_seen(world.ckpt, log, f) > b, TIMEOUT, f"'fault {fault}'", proc)
        wait_for(lambda: actor_pids(proc.pid, "GenerationWorker"), TIMEOUT, "a generation worker", proc)
        new = set(actor_pids(proc.pid, "GenerationWorker")) - engines_before
        restores.append(Restore(kind, fault, engine_starts=len(new)))
    return restores, kills


def one(engine: str, path: str, kinds: list[str], base: Path) -> EngineRun:
    """One run with one kill of every kind; its restores measured and checked."""
    world = hf_world(
        base,
        model=make_model_dir(base / "model", **TINY_LLAMA),
        rows=ARITHMETIC * 4,
        reward=("my_reward", REWARD),
        lr=1e-3,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    max_steps = 4 + (STEPS_BETWEEN + 1) * len(kinds)
    extra = [
        "trainer.num_workers=2",
        "trainer.strategy=fsdp",
        f"generation.engine={engine}",
        "generation.max_model_len=256",
        f"run.in_job_restore={path}",
        f"run.max_in_job_restores={len(kinds) + 1}",
    ]
    log = base / "run.log"
    started = time.monotonic()
    proc = start_logged(*world.run_args(max_steps, *extra), log=log, env=world.env)
    problems: list[str] = []
    restores: list[Restore] = []
    kills: list[float] = []
    try:
        restores, kills = kill_each(proc, world, log, kinds)
        run = finish(proc, TIMEOUT, f"the {engine} {path} run")
        if run.rc != 0:
            problems.append(f"exit {run.rc}: {log.read_text()[-600:]}")
    except (AssertionError, TimeoutError) as exc:
        problems.append(f"{str(exc).splitlines()[0]}; last output: {log.read_text()[-600:]}")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    wall = time.monotonic() - started
    problems += check(world, log, max_steps, restores, kills)
    load = round(os.getloadavg()[0], 1)
    return EngineRun(engine, path, restores, problems, round(wall, 1), load, run_goodput(world.ckpt))


def check(world: Any, log: Path, max_steps: int, restores: list[Restore], kills: list[float]) -> list[str]:
    """Fill each restore from its fault event and the trace; the run's verdicts."""
    problems = [] if f"done: step {max_steps}" in log.read_text() else ["did not reach the last step"]
    events = [f.data for f in read_history(world.ckpt / "logs").events_named("fault")]
    got = [(e["fault"], e["outcome"]) for e in events]
    if got != [(r.fault, "recovered") for r in restores]:
        problems.append(f"fault events {got}, expected one recovered per kill {[r.fault for r in restores]}")
    trace = read_trace(world.trace)
    resumed = first_rollouts(trace)
    for n, (r, e) in enumerate(zip(restores, events, strict=False)):
        if e.get("prompts_lost") or e.get("prompts_duplicated") or "restored_step" not in e:
            problems.append(f"{r.fault}: lost {e.get('prompts_lost')}, dup {e.get('prompts_duplicated')}, {e}")
        r.path, r.recovery_s, r.named_restarted = str(e.get("path")), e.get("recovery_s"), list(e.get("restarted", []))
        r.resume_to_first_token_s = resumed[n] if n < len(resumed) else None
        r.kill_to_first_token_s = first_rollout_after(trace, kills[n])
        named = sum(s.startswith("generation worker") or s == "every actor of the job" for s in r.named_restarted)
        if (r.engine_starts > 0) != (named > 0):
            problems.append(f"{r.fault}: {r.engine_starts} new engine processes, the event names {r.named_restarted}")
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(world.ckpt), timeout=300)
    if verify.rc != 0:
        problems.append(f"ckpt verify: {verify.out[-400:]}")
    return problems


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(runs: list[EngineRun], kinds: list[str]) -> list[str]:
    """Per fault kind, per (path, engine): restore s / engine starts / resume → first token s / kill → first token s."""
    head = [f"{r.path} {r.engine}" for r in runs]
    lines = [
        "| fault | " + " | ".join(head) + " |",
        "|---" * (len(runs) + 1) + "|",
    ]
    for n, kind in enumerate(kinds):
        cells = []
        for run in runs:
            r = run.restores[n] if n < len(run.restores) else None
            cells.append(
                "-"
                if r is None
                else f"{fmt(r.recovery_s)} / {r.engine_starts} / {fmt(r.resume_to_first_token_s)} / "
                f"{fmt(r.kill_to_first_token_s)}"
            )
        lines.append(f"| {KILLS[kind][1]} | " + " | ".join(cells) + " |")
    return lines


def verdicts(runs: list[EngineRun]) -> list[str]:
    """0 engine starts in warm restores of these faults; vLLM's resume → first token ≤ 2x HF's (medians)."""
    out = []
    by = {(r.path, r.engine): r for r in runs}
    for path in dict.fromkeys(r.path for r in runs):
        vllm, hf = by.get((path, "vllm")), by.get((path, "hf"))
        if vllm is not None and not vllm.restores:
            out.append(f"{path}: vLLM: no restore measured (the run failed before its first)")
        elif vllm is not None:
            starts = sum(r.engine_starts for r in vllm.restores)
            word = "met" if starts == 0 else ("MISSED" if path == "warm" else "(the full rebuild's cost)")
            out.append(f"{path}: vLLM engine starts in {len(vllm.restores)} restores: {starts} {word}")
        if vllm is None or hf is None:
            continue
        for key, what in (
            ("resume_to_first_token_s", "resume -> first token"),
            ("kill_to_first_token_s", "kill -> first token"),
        ):
            v = median([getattr(r, key) for r in vllm.restores if getattr(r, key) is not None])
            h = median([getattr(r, key) for r in hf.restores if getattr(r, key) is not None])
            if v == v and h == h:  # both measured (not NaN)
                out.append(f"{path}: " + ratio_verdict(f"{what}, vLLM vs HF (median)", v, h, 2.0))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--restore", nargs="+", choices=["warm", "full"], default=["warm", "full"])
    parser.add_argument("--kinds", default="trainer,storage,tq-controller,controller", help="comma-separated")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a new temporary one)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = parser.parse_args()
    kinds = [k.replace("_", "-") for k in args.kinds.split(",") if k]
    wrong = [k for k in kinds if k not in KILLS or k == "generation"]
    if wrong or not kinds:
        print(f"in_job_engines: --kinds {wrong or '(none)'}: choose from trainer,storage,tq-controller,controller")
        return 2
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-in-job-engines-"))
    load_start = round(os.getloadavg()[0], 1)
    runs = []
    for path in args.restore:
        for engine in args.engine:
            run = one(engine, path, kinds, work / f"{path}-{engine}")
            runs.append(run)
            verdict = "passed" if not run.problems else "FAILED: " + "; ".join(run.problems)
            gp = pct(run.goodput)
            print(f"{path} {engine}: {run.wall_s:.0f} s wall, goodput {gp}, load {run.load_after}: {verdict}")
    print(f"load average {load_start} at the start, {os.getloadavg()[0]:.1f} at the end")
    print("cells: restore s / engine starts / resume -> first token s / kill -> first token s")
    print("\n".join(table(runs, kinds) + verdicts(runs)))
    if args.out:
        args.out.write_text(json.dumps({"load_start": load_start, "runs": [asdict(r) for r in runs]}, indent=1))
    failed = sum(bool(r.problems) for r in runs)
    print(f"{len(runs) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
