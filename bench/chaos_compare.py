"""``bench/chaos.py --in-job --restore warm,full``: the same in-job chaos runs (``bench/chaos_in_job.py``) once per
``run.in_job_restore`` path, side by side in one bench run, and the restore table: recovery median/max per fault
kind and the warm/full ratio, engine starts in restores of faults that were not an engine's, goodput, the machine's
load — and, when ``warm`` ran, the budget "restore ≤ one actor's start + the bundle read at raw disk speed + 50%"
measured after the runs in the same bench run (``bench/restore_budget.py``) with its verdict per kind: against the
start of one actor of the kind that died, and against a bare actor's.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.chaos_in_job import Shape, one_run, pct
from bench.kill_stress import steps
from bench.restore_figures import Budget, budget_line, budget_verdicts, kind_line, kind_verdicts


def restores_by_kind(faults: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """In-job restores only (a ``restored_step``): recovery seconds median/max and count per fault kind."""
    by: dict[str, list[float]] = {}
    for f in faults:
        if "restored_step" in f and f.get("outcome") == "recovered":
            by.setdefault(f["fault"], []).append(float(f["recovery_s"]))
    return {
        k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1), "n": len(v)}
        for k, v in sorted(by.items())
    }


def engine_starts(faults: list[dict[str, Any]], engines: int) -> int:
    """Generation engines started by restores of faults that were not an engine's: a full rebuild starts every one,
    a warm restore the ones it names as restarted."""
    starts = 0
    for f in faults:
        if "restored_step" not in f or f["fault"] == "generation.worker":
            continue
        if str(f.get("path", "full")).startswith("full"):
            starts += engines
        else:
            starts += sum(str(r).startswith("generation worker") for r in f.get("restarted", []))
    return starts


SPARE = "+spare"  # a path's suffix: the same path with one spare trainer rank (trainer.spare_ranks=1)


def path_sets(path: str) -> list[str]:
    """The ``--set`` of a compared path: ``warm``, ``full`` (``run.in_job_restore``), or either + ``SPARE``."""
    mode = path.removesuffix(SPARE)
    if mode not in ("warm", "full"):
        raise ValueError(f"--restore takes warm, full, warm{SPARE} or full{SPARE}, not {path!r}")
    return [f"run.in_job_restore={mode}", *(["trainer.spare_ranks=1"] if path.endswith(SPARE) else [])]


def compare_restores(iterations: int, seed: int, work: Path, shape: Shape, paths: list[str], baseline: bool) -> int:
    """The same runs (same seed: the same kills at the same steps) once per ``run.in_job_restore`` path, side by
    side: recovery median/max per kind, engine starts, goodput, the machine's load while they ran, the budget."""
    results: dict[str, Any] = {"load_average_start": [round(x, 1) for x in os.getloadavg()]}
    failed = 0
    for path in paths:
        rng = random.Random(seed)
        sets = [*shape.sets, *path_sets(path)]
        runs = []
        for i in range(iterations):
            o = one_run(i, rng, work / path, replace(shape, sets=sets))
            runs.append(o)
            verdict = "ok" if not o.problems else "FAIL " + "; ".join(o.problems)
            print(f"[{path} {i + 1}/{iterations}] {o.what}: goodput {pct(o.goodput)} of {o.wall_s:.0f}s: {verdict}")
            print(f"  load average {os.getloadavg()[0]:.1f}", flush=True)
        failed += sum(bool(o.problems) for o in runs)
        faults = [f for o in runs for f in o.faults]
        results[path] = {
            "restores": restores_by_kind(faults),
            "engine_starts": engine_starts(faults, engines=1),
            "goodput": [None if o.goodput is None else round(o.goodput, 4) for o in runs],
            "wall_s": [round(o.wall_s, 1) for o in runs],
            "load_average_after": [round(x, 1) for x in os.getloadavg()],
        }
    if baseline:
        free = one_run(0, random.Random(seed), work / "fault-free", Shape(shape.max_steps, 0, [], shape.sets))
        results["fault-free"] = {"goodput": [free.goodput], "wall_s": [round(free.wall_s, 1)]}
    warm = next((p for p in paths if p.startswith("warm")), None)
    budget = measure_budget(work / warm / "run0" / "ckpt", shape.sets) if warm else None
    if budget is not None:
        results["budget"] = {**budget.__dict__, "seconds": round(budget.seconds, 2)}
    results["load_average_end"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(results))
    print_restore_table(results, paths)
    for p in (p for p in paths if p.startswith("warm") and budget is not None):
        print(f"{p}:")
        print_budget(results[p]["restores"], budget)
    return 1 if failed else 0


def measure_budget(root: Path, sets: list[str]) -> Budget | None:
    """The budget's halves, measured now (the runs are over) on the warm run's newest bundle, with the runs' config
    (``sets``); None without a bundle."""
    from bench.restore_budget import measure

    found = steps(root) if root.is_dir() else []
    return measure(root / f"step_{found[-1]}", sets) if found else None


def print_restore_table(results: dict[str, Any], paths: list[str]) -> None:
    kinds = sorted({k for p in paths for k in results[p]["restores"]})
    print("| fault | " + " | ".join(f"{p}: median / max s (n)" for p in paths) + " | / full (median) |")
    print("|---" * (len(paths) + 2) + "|")
    for kind in kinds:
        cells = []
        for p in paths:
            r = results[p]["restores"].get(kind)
            cells.append("-" if r is None else f"{r['median']} / {r['max']} ({r['n']})")
        full = results.get("full", {}).get("restores", {}).get(kind)
        ratios = []
        for p in (p for p in paths if p.startswith("warm")):
            warm = results[p]["restores"].get(kind)
            ratios.append(f"{p}: {warm['median'] / full['median']:.2f}x" if warm and full else "-")
        print(f"| {kind} | " + " | ".join(cells) + f" | {'; '.join(ratios) or '-'} |")
    for p in paths:
        r = results[p]
        print(f"{p}: engine starts in restores of other faults {r['engine_starts']}, goodput {r['goodput']}")


def print_budget(restores: dict[str, dict[str, float]], budget: Budget) -> None:
    """The verdict per kind: the warm median restore against one actor's start + the bundle's raw read + 50%."""
    print(f"warm restore <= the start of one actor of the kind that died + bundle at raw disk speed + 50%: "
          f"{kind_line(budget)}")  # fmt: skip
    for v in kind_verdicts(restores, budget):
        print(f"  {v.line()}")
    print(f"warm restore <= a bare actor's start + bundle at raw disk speed + 50%: {budget_line(budget)}")
    for v in budget_verdicts(restores, budget):
        print(f"  {v.line()}")
