#!/usr/bin/env python3
"""An in-job restore on the hf backend with each generation engine: a trainer rank SIGKILLed mid-run.

Usage (repo root):  .venv/bin/python bench/in_job_engines.py [--engine hf vllm] [--dir DIR]

Per engine, one real ``sc-app run`` (``model.backend=hf``: a tiny Llama built here, a JSONL task, a user reward;
two FSDP trainer ranks, a bundle every 2 steps, 10 steps) whose second trainer rank is SIGKILLed by PID after 3
train steps. Pass = exit 0 at step 10, one ``trainer.worker`` fault event ``recovered`` from a bundle
(``restored_step``), no prompt lost or duplicated, every bundle verifies. Prints one line per engine with the
recovery seconds (for vLLM they include a new engine's start). Not in the default suite: each run is a model
load and, for vLLM, two engine starts (1-2 min here); ``tests/e2e/test_in_job_restore.py`` is the suite's proof
on the tiny backend.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sc_app.observe.reader import read_history
from tests.support.hf import ARITHMETIC, hf_world, make_model_dir
from tests.support.proc import actor_pids, finish, read_trace, sc_app, start_logged, wait_for
from tests.support.vllm_host import TINY_LLAMA

REWARD = (
    "from sc_app.rl.hf.rewards import numeric_match\n"
    "def score(*, prompt, completion, answer):\n"
    "    return numeric_match(prompt=prompt, completion=completion, answer=answer)\n"
)
MAX_STEPS = 10


def one(engine: str, base: Path) -> list[str]:
    """Run, kill, check; returns the problems (empty: passed)."""
    world = hf_world(
        base,
        model=make_model_dir(base / "model", **TINY_LLAMA),  # head_dim 64: vLLM's CPU attention needs it
        rows=ARITHMETIC * 4,
        reward=("my_reward", REWARD),
        lr=1e-3,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    extra = ["trainer.num_workers=2", "trainer.strategy=fsdp", f"generation.engine={engine}"]
    log = base / "run.log"
    proc = start_logged(*world.run_args(MAX_STEPS, *extra, "generation.max_model_len=256"), log=log, env=world.env)
    try:
        wait_for(lambda: sum(e["ev"] == "train" for e in read_trace(world.trace)) >= 3, 900, "3 steps", proc)
        os.kill(actor_pids(proc.pid, "TrainerWorker")[-1], signal.SIGKILL)
        run = finish(proc, 900, f"the {engine} run")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    problems = [] if run.rc == 0 else [f"exit {run.rc}: {log.read_text()[-600:]}"]
    faults = read_history(world.ckpt / "logs").events_named("fault")
    if [(f.data["fault"], f.data["outcome"]) for f in faults] != [("trainer.worker", "recovered")]:
        problems.append(f"fault events {[f.data for f in faults]}")
    for f in faults:
        lost, dup = f.data["prompts_lost"], f.data["prompts_duplicated"]
        print(f"{engine}: trainer killed at step {f.step}, restored step_{f.data.get('restored_step')} in "
              f"{f.data['recovery_s']:.1f}s, {f.data['steps_redone']} steps redone, prompts lost {lost}, dup {dup}")
    if f"done: step {MAX_STEPS}" not in log.read_text():
        problems.append("did not reach the last step")
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(world.ckpt), timeout=300)
    if verify.rc != 0:
        problems.append(f"ckpt verify: {verify.out[-400:]}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", nargs="+", choices=["hf", "vllm"], default=["hf", "vllm"])
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: a new temporary one)")
    args = parser.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-in-job-engines-"))
    failed = 0
    for engine in args.engine:
        problems = one(engine, work / engine)
        failed += bool(problems)
        print(f"{engine}: {'passed' if not problems else 'FAILED: ' + '; '.join(problems)}")
    print(f"{len(args.engine) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
