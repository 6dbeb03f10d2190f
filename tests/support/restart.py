"""Check, from a run's trace, that a killed generation worker was replaced and that no prompt was lost or repeated.

Shared by the end-to-end tests (tiny, hf and vLLM engines) and ``bench/chaos.py --in-job``: one definition of
"recovered without losing or repeating a prompt, serving the current weights".
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.proc import read_trace


def generation_restart_problems(events: list[dict[str, Any]]) -> list[str]:
    """What is wrong with one attempt's generation restarts (its trace ``events``); [] when each is sound.

    Each ``generation_restart`` follows a ``give_back`` of the dead call's prompts; the new worker holds at least the
    version training had reached before it (a step finished meanwhile may move it on); its first rollout serves that
    version or a newer one, never an older one; every given-back prompt is issued once more."""
    problems: list[str] = []
    restarts = [n for n, e in enumerate(events) if e["ev"] == "generation_restart"]
    given = [e for e in events if e["ev"] == "give_back"]
    if len(given) != len(restarts):
        problems.append(f"{len(given)} give_back events for {len(restarts)} generation restarts")
    issued = Counter(p for e in events if e["ev"] == "issue" for p in e["prompts"])
    for g in given:
        if any(issued[p] < 2 for p in g["prompts"]):
            problems.append(f"given-back prompts {g['prompts']} were not issued again")
    for at in restarts:
        restart = events[at]
        trained_before = max((e["step"] for e in events[:at] if e["ev"] == "train"), default=0)
        if restart["version"] < trained_before:
            problems.append(
                f"worker {restart['worker']} restarted at version {restart['version']}, "
                f"training was at {trained_before}"
            )
        served = [e["version"] for e in events[at:] if e["ev"] == "rollout" and e["worker"] == restart["worker"]]
        if served and served[0] < restart["version"]:
            problems.append(
                f"worker {restart['worker']} served version {served[0]} after restarting at {restart['version']}"
            )
    return problems


def attempts_of(events: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A trace cut at its ``start`` events: one list per start (a process start or an in-job restore)."""
    out: list[list[dict[str, Any]]] = []
    for ev in events:
        if ev["ev"] == "start" or not out:
            out.append([])
        out[-1].append(ev)
    return out


def kept_history(events: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Prompts trained and dropped (stale) in the history the run kept: of each start's events, the steps up to the
    step the next start restored (the later ones were redone after it, from that bundle) — a drop counts with the
    step trained after it. The same rule for a process restart and an in-job restore."""
    trained: list[int] = []
    dropped: list[int] = []
    parts = attempts_of(events)
    for n, part in enumerate(parts):
        last = n == len(parts) - 1
        limit = float("inf") if last else parts[n + 1][0]["step"]
        drops: list[int] = []
        for ev in part:
            if ev["ev"] == "drop_stale":
                drops += ev["prompts"]
            elif ev["ev"] == "train" and ev["step"] <= limit:
                trained += ev["prompts"]
                dropped, drops = dropped + drops, []
        if last:
            dropped += drops
    return trained, dropped


def prompt_problems(events: list[dict[str, Any]], next_index: int, held: set[int]) -> list[str]:
    """Every prompt below the loader's ``next_index`` (of the newest bundle) trained exactly once in the kept
    history, or dropped as stale, or still ``held`` (listed by that bundle's index or due for re-issue)."""
    trained, dropped = kept_history(events)
    twice = sorted(p for p, n in Counter(trained + dropped).items() if n > 1)
    ever_dropped = {p for e in events if e["ev"] == "drop_stale" for p in e["prompts"]}
    accounted = set(trained) | ever_dropped | held
    lost = [p for p in range(next_index) if p not in accounted]
    problems = []
    if twice:
        problems.append(f"prompts trained twice: {twice[:10]}")
    if lost:
        problems.append(f"prompts lost (neither trained, dropped nor held): {lost[:10]}")
    return problems


def run_events(trace: Path, run: int) -> list[dict[str, Any]]:
    """The events of start number ``run`` (0-based) of a ``run.trace_file``; [] before it started."""
    parts = attempts_of(read_trace(trace))
    return parts[run] if len(parts) > run else []


def trained_steps(trace: Path, run: int) -> int:
    """Train steps of start number ``run`` so far."""
    return sum(e["ev"] == "train" for e in run_events(trace, run))


def restarted_and_trained(trace: Path, run: int) -> bool:
    """A generation worker of start number ``run`` was replaced and a step was trained after that."""
    events = run_events(trace, run)
    at = next((n for n, e in enumerate(events) if e["ev"] == "generation_restart"), None)
    return at is not None and any(e["ev"] == "train" for e in events[at:])
