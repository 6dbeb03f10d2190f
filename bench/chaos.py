#!/usr/bin/env python3
"""Bystander chaos: a live run, the commands operators and other runs throw at its directory, and random ends.

Usage (repo root):  .venv/bin/python bench/chaos.py --iterations 20 [--seed 1] [--dir DIR]

Each iteration starts (or resumes) a real ``sc-app run`` (embedded Ray + TransferQueue) on one checkpoint directory
and, while it trains, fires bystander commands at random moments: ``preflight`` (with and without ``--dry-run``),
``ckpt list``, ``ckpt verify``, ``ckpt prune``, a run that is refused (incompatible config), a run that has nothing
left to train, and a ``tmp_step_*`` planted as if it were the live writer's save in progress. It then ends the run
one of three ways: ``sc-app stop --wait`` (graceful), SIGTERM of the driver, or SIGKILL of the whole session.
Checks, every iteration:
  * no bystander changed the live run's lease (epoch and run id), moved its in-progress save, or made a save fail;
    the refused runs exit 2 and the "nothing to train" run exits 0, without taking the lease;
  * the live run never exits 3 (superseded) or 1 (failed); a graceful end exits 143 with a bundle of the step it
    reached; every bundle it published that retention keeps is still there and verifies;
  * afterwards preflight resumes the newest bundle, and the next iteration resumes from it.
Prints one line per iteration and ``N passed, M failed``; exits 1 if any check failed.

``--in-job`` runs the in-job fault chaos instead (``bench/chaos_in_job.py``: process kills of the run's actors and
failing data-plane calls the run must survive without exiting; ``--kinds``, ``--max-steps``, ``--faults``, ``--set``;
``--each``: one kill of every kind of ``--kinds`` per run, in its order; ``--restore warm,full``: the same runs once
per ``run.in_job_restore`` path and the restore table, ``bench/chaos_compare.py``):
  .venv/bin/python bench/chaos.py --in-job --iterations 10 --seed 1 --kinds generation,trainer,storage,tq-controller,dp
  .venv/bin/python bench/chaos.py --in-job --restore warm,full --each --kinds trainer,storage,tq-controller,controller
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.tally import Tally  # noqa: E402
from sc_app.checkpoint import plan_resume, verify_bundle  # noqa: E402
from tests.support.proc import kill_session, sc_app, start_logged, step_bundles, wait_for  # noqa: E402

KEEP = 3
SAVE_PERIOD = 2


def steps(root: Path) -> list[int]:
    return sorted(step_bundles(root))


def lease_of(root: Path) -> tuple[str, int] | None:
    try:
        doc = json.loads((root / "LEASE").read_text())
    except (OSError, ValueError):
        return None
    return doc.get("run_id"), doc.get("epoch")


def saved_steps(log: Path) -> list[int]:
    return [int(m) for m in re.findall(r"saved step_(\d+)", log.read_text())]


def bystander(kind: str, root: Path, work: Path, i: int) -> str | None:
    """Run one bystander command; returns a problem, or None when it behaved."""
    if kind == "preflight":
        res = sc_app("preflight", "--checkpoint-dir", str(root), timeout=300)
        return None if res.rc == 0 else f"preflight exited {res.rc}: {res.out[-300:]}"
    if kind == "preflight-dry-run":
        res = sc_app("preflight", "--checkpoint-dir", str(root), "--dry-run", "--json", timeout=300)
        return None if res.rc == 0 else f"preflight --dry-run exited {res.rc}"
    if kind == "list":
        res = sc_app("ckpt", "list", "--checkpoint-dir", str(root), "--json", timeout=300)
        return None if res.rc == 0 else f"ckpt list exited {res.rc}"
    if kind == "verify":
        res = sc_app("ckpt", "verify", "--checkpoint-dir", str(root), timeout=300)
        # a bundle pruned by the live run while verify read it is a legitimate report, not a crash
        return None if res.rc in (0, 2) and "Traceback" not in res.out else f"ckpt verify crashed: {res.out[-300:]}"
    if kind == "prune":
        res = sc_app("ckpt", "prune", "--checkpoint-dir", str(root), "--keep", "1", timeout=300)
        return None if res.rc == 2 and "live lease" in res.out else f"prune beside a live run: rc {res.rc}"
    if kind == "refused-run":
        res = sc_app("run", "--checkpoint-dir", str(root), "--set", "grpo.group_size=4", timeout=300)
        return None if res.rc == 2 and "incompatible" in res.out else f"incompatible run: rc {res.rc}"
    if kind == "nothing-to-train":
        res = sc_app("run", "--checkpoint-dir", str(root), "--max-steps", "1", timeout=300)
        return None if res.rc == 0 and "nothing to train" in res.out else f"finished run: rc {res.rc}"
    raise ValueError(kind)


BYSTANDERS = ["preflight", "preflight-dry-run", "list", "verify", "prune", "refused-run", "nothing-to-train"]


def one_iteration(i: int, rng: random.Random, root: Path, work: Path) -> tuple[str, list[str]]:
    before = steps(root)
    log = work / f"live{i}.log"
    args = ["run", "--checkpoint-dir", str(root), "--max-steps", "1000000"]
    live = start_logged(
        *args, "--set", f"checkpoint.save_period={SAVE_PERIOD}", "--set", f"checkpoint.keep={KEEP}", log=log
    )
    planted = root / f"tmp_step_{90_000_000 + i}"
    end = rng.choice(["stop", "sigterm", "sigkill"])
    fired: list[str] = []
    problems: list[str] = []
    code: int | None = None
    try:
        wait_for(lambda: any(s > (before[-1] if before else 0) for s in saved_steps(log)), 300, "a save", live)
        planted.mkdir()
        fire_bystanders(rng, root, work, i, live, planted, fired, problems)
        if live.poll() is None:
            code = end_the_run(end, rng, root, live, problems)
    except subprocess.TimeoutExpired:
        problems.append(f"the live run did not end after {end}")
    finally:
        kill_session(live.pid)
    problems += check_the_end(end, code, log, root)
    if planted.exists():  # the harness's own leftover, not a bystander's: out of the way of the next iteration
        planted.rename(work / planted.name)
    plan = plan_resume(root, tidy=False)
    if steps(root) and (plan.decision != "resume" or plan.step != steps(root)[-1]):
        problems.append(f"preflight would resume {plan.step} ({plan.decision}), newest is {steps(root)[-1]}")
    return f"{','.join(fired)} then {end}: bundles {steps(root)}", problems


def fire_bystanders(
    rng: random.Random, root: Path, work: Path, i: int, live: Any, planted: Path, fired: list[str], problems: list[str]
) -> None:
    """Bystander commands against the live run's directory; each must leave its lease, tmp dir and run alone."""
    holder = lease_of(root)
    for kind in rng.sample(BYSTANDERS, k=rng.randint(3, len(BYSTANDERS))):
        time.sleep(rng.uniform(0.0, 3.0))
        fired.append(kind)
        problem = bystander(kind, root, work, i)
        if problem:
            problems.append(problem)
        if lease_of(root) != holder:
            problems.append(f"the lease changed after {kind}: {holder} -> {lease_of(root)}")
        if not planted.is_dir():
            problems.append(f"the live writer's tmp dir was moved by {kind}")
        if live.poll() is not None:
            problems.append(f"the live run exited {live.returncode} after {kind}")
            break


def end_the_run(end: str, rng: random.Random, root: Path, live: Any, problems: list[str]) -> int | None:
    """``sc-app stop --wait``, SIGTERM or (after a random moment; the caller's SIGKILL) nothing; the exit code."""
    if end == "stop":
        res = sc_app("stop", "--checkpoint-dir", str(root), "--wait", "240", timeout=300)
        if res.rc != 0:
            problems.append(f"stop --wait exited {res.rc}: {res.out[-300:]}")
        return int(live.wait(timeout=120))
    if end == "sigterm":
        os.kill(live.pid, signal.SIGTERM)
        return int(live.wait(timeout=240))
    time.sleep(rng.uniform(0.0, 5.0))
    return None


def check_the_end(end: str, code: int | None, log: Path, root: Path) -> list[str]:
    """A graceful end saved the step it stopped at; nothing published is gone; every bundle verifies."""
    problems: list[str] = []
    out = log.read_text()
    if "SAVE FAILED" in out:
        problems.append("a save of the live run failed")
    if end in ("stop", "sigterm") and code is not None:
        stopped_at = re.search(r"stopped: step (\d+) saved on request", out)
        if code != 143:
            problems.append(f"a graceful {end} ended with exit {code}, expected 143")
        elif stopped_at and int(stopped_at.group(1)) not in steps(root):
            problems.append(f"no bundle of the step it stopped at ({stopped_at.group(1)}): {steps(root)}")
        elif not stopped_at and "nothing trained since the newest bundle" not in out:
            problems.append("exit 143 without saying which bundle covers the step it stopped at")
    kept_from = min(steps(root)[-KEEP:], default=0)  # retention keeps the newest KEEP bundles on disk
    for step in saved_steps(log):
        if step >= kept_from and step not in steps(root):
            problems.append(f"step_{step} was published and is gone")
    for step in steps(root):
        report = verify_bundle(root / f"step_{step}")
        if not report.ok:
            problems.append(f"step_{step} does not verify: {report.problems[0]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a new temp dir)")
    in_job = ap.add_argument_group("in-job faults (bench/chaos_in_job.py)")
    in_job.add_argument("--in-job", action="store_true", help="faults the run must survive without exiting")
    in_job.add_argument("--kinds", default="generation,trainer,storage,tq-controller,dp", help="comma-separated")
    in_job.add_argument("--max-steps", type=int, default=60, help="steps of every run")
    in_job.add_argument("--faults", type=int, default=3, help="process kills per run")
    in_job.add_argument(
        "--each", action="store_true", help="kill each of --kinds once per run, in its order (not --faults at random)"
    )
    in_job.add_argument("--no-baseline", action="store_true", help="skip the fault-free run")
    in_job.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="for every run")
    in_job.add_argument(
        "--restore",
        default="",
        help="e.g. warm,warm+spare,full: the same runs once per run.in_job_restore path (+spare: with one spare "
        "trainer rank), side by side",
    )
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.in_job:
        from bench.chaos_in_job import Shape
        from bench.chaos_in_job import main as in_job_main

        kinds = [k.replace("_", "-") for k in args.kinds.split(",") if k]  # tq_controller or tq-controller
        shape = Shape(args.max_steps, args.faults, kinds, args.set, each=args.each)
        if args.restore:
            from bench.chaos_compare import compare_restores, path_sets

            paths = [p for p in args.restore.split(",") if p]
            try:
                for p in paths:
                    path_sets(p)  # an unknown path: one line, before any run
            except ValueError as exc:
                print(f"chaos.py: {exc}", file=sys.stderr)
                return 2
            return compare_restores(args.iterations, args.seed, work, shape, paths, baseline=not args.no_baseline)
        return in_job_main(args.iterations, args.seed, work, shape, baseline=not args.no_baseline)
    root = work / "ckpt"
    rng = random.Random(args.seed)
    tally = Tally(args.iterations)
    for i in range(args.iterations):
        tally.record(i, *one_iteration(i, rng, root, work))
    return tally.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
