"""The goodput ledger: where a run's wall time went, and what its faults cost — computed from the run log alone.

Pure: reads a ``RunHistory`` (``sc_app.observe.reader``), no Ray, no torch, no I/O. Per attempt (one try of the
job, from its ``start`` event to its last line):

* ``training`` — productive time: the step seconds of the steps that count (of each step, the line of the newest
  attempt that trained it), less the training pause of the saves cut in them and the seconds spent
  recovering from faults in them;
* ``startup`` — a fresh attempt's time from its ``start`` event until its first step began (Ray, TransferQueue,
  workers, model load); ``restore`` — the same for an attempt that resumed a bundle (everything a retry pays before
  training again, the restore included);
* ``saves`` — training paused for bundles (``paused_seconds`` of every published one);
* ``recoveries`` — in-job recovery (``recovery_s`` of every ``fault`` event: a retry or worker restart inside the
  steps, or an in-job restore between them);
* ``redone`` — step seconds of steps whose record a later attempt replaced: work lost with a fault and trained again;
* ``other`` — the rest: steps not yet logged, the end (final save, shutdown), log delays.

Between attempts (``between_attempts``: a KubeRay retry's new cluster, pod start) counts in the run's wall time.
Goodput = training / wall. What an attempt did before its ``start`` event (interpreter start, config checks) is not
in the log and not counted. Step lines an attempt wrote from a bundle for an earlier attempt (``recovered``) are the
earlier attempt's work: an attempt's own steps are those after the step it started from.
"""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sc_app.observe.reader import RunHistory
from sc_app.observe.records import SAVE_EVENTS, LoggedEvent, LoggedStep

BUCKETS = ("training", "startup", "restore", "saves", "recoveries", "redone", "between_attempts", "other")
LABELS = {
    "training": "training",
    "startup": "start-up",
    "restore": "restore (retry)",
    "saves": "saves",
    "recoveries": "in-job recoveries",
    "redone": "redone steps",
    "between_attempts": "between attempts",
    "other": "other",
}


@dataclass(frozen=True)
class AttemptTime:
    attempt: int
    resumed: bool
    start_t: float
    end_t: float
    seconds: dict[str, float]  # bucket -> seconds; they add up to wall_s

    @property
    def wall_s(self) -> float:
        return self.end_t - self.start_t

    @property
    def goodput(self) -> float | None:
        return self.seconds["training"] / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class FaultCosts:
    """Every ``fault`` event summed up."""

    count: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)  # "<fault> <outcome>" -> count
    recovery_s_median: float | None = None
    recovery_s_max: float | None = None
    detection_s_max: float | None = None
    steps_redone: int = 0
    rollouts_regenerated: int = 0
    prompts_lost: int = 0
    prompts_duplicated: int = 0


@dataclass(frozen=True)
class Ledger:
    attempts: list[AttemptTime]
    seconds: dict[str, float]  # the run's, between attempts included
    faults: FaultCosts
    job_retries: int  # attempts that resumed a bundle after an earlier attempt of this log

    @property
    def wall_s(self) -> float:
        return sum(self.seconds.values())

    @property
    def goodput(self) -> float | None:
        return self.seconds["training"] / self.wall_s if self.wall_s > 0 else None

    def line(self) -> str:
        """One line for the driver's output and ``sc-app k8s status``."""
        if self.goodput is None:
            return "goodput: nothing measured yet"
        rest = ", ".join(f"{LABELS[k]} {v:.1f}s" for k, v in self.seconds.items() if k != "training" and v >= 0.05)
        return (
            f"goodput {100 * self.goodput:.1f}% of {self.wall_s:.1f}s wall: training {self.seconds['training']:.1f}s"
            + (f", {rest}" if rest else "")
            + f"; faults {self.faults.count} (prompts lost {self.faults.prompts_lost}, duplicated "
            f"{self.faults.prompts_duplicated})"
        )

    def as_event(self) -> dict[str, Any]:
        """The fields of the run log's ``goodput`` event."""
        return {
            "goodput": self.goodput,
            "wall_s": self.wall_s,
            "seconds": dict(self.seconds),
            "faults": self.faults.count,
            "prompts_lost": self.faults.prompts_lost,
            "prompts_duplicated": self.faults.prompts_duplicated,
        }


def _num(data: Any, key: str) -> float:
    v = data.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _start(events: list[LoggedEvent]) -> LoggedEvent | None:
    return next((e for e in events if e.name == "start"), None)


def _own(events: list[LoggedEvent], steps: list[LoggedStep]) -> list[LoggedStep]:
    """The steps an attempt trained itself (after the step it started from), in the order it logged them."""
    start = _start(events)
    from_step = start.step if start is not None and start.step is not None else 0
    return sorted((s for s in steps if s.step > from_step), key=lambda s: s.stamp.t)


def _attempt(n: int, events: list[LoggedEvent], steps: list[LoggedStep], counts: set[int]) -> AttemptTime:
    """``counts``: ids of the step lines that are the effective record of their step."""
    start = _start(events)
    times = [e.stamp.t for e in events] + [s.stamp.t for s in steps]
    start_t = start.stamp.t if start is not None else min(times)
    end_t = max(times)
    resumed = any(e.name == "resume" for e in events)
    own = _own(events, steps)
    sec = dict.fromkeys(BUCKETS, 0.0)
    began = max(start_t, own[0].stamp.t - own[0].record.step_seconds) if own else end_t
    sec["restore" if resumed else "startup"] = began - start_t
    train = 0.0
    for s in own:
        if id(s) in counts:
            train += s.record.step_seconds
        else:
            sec["redone"] += s.record.step_seconds
    sec["saves"] = sum(_num(e.data, "paused_seconds") for e in events if e.name in SAVE_EVENTS)
    faults = [e for e in events if e.name == "fault"]
    sec["recoveries"] = sum(_num(e.data, "recovery_s") for e in faults)
    # a retry inside a step is part of its step seconds; an in-job restore (rebuild between steps) is not
    in_steps = sum(_num(e.data, "recovery_s") for e in faults if "restored_step" not in e.data)
    sec["training"] = max(0.0, train - sec["saves"] - in_steps)
    sec["other"] = max(0.0, (end_t - start_t) - sum(sec.values()))
    end_t = max(end_t, start_t + sum(sec.values()))  # steps logged late can exceed the span: wall = the sum
    return AttemptTime(n, resumed, start_t, end_t, sec)


def _faults(events: list[LoggedEvent]) -> FaultCosts:
    faults = [e for e in events if e.name == "fault"]
    if not faults:
        return FaultCosts()
    rec = [_num(e.data, "recovery_s") for e in faults]
    kinds = Counter(f"{e.data.get('fault')} {e.data.get('outcome')}" for e in faults)
    return FaultCosts(
        count=len(faults),
        by_kind=dict(sorted(kinds.items())),
        recovery_s_median=statistics.median(rec),
        recovery_s_max=max(rec),
        detection_s_max=max(_num(e.data, "detection_s") for e in faults),
        steps_redone=int(sum(_num(e.data, "steps_redone") for e in faults)),
        rollouts_regenerated=int(sum(_num(e.data, "rollouts_regenerated") for e in faults)),
        prompts_lost=int(sum(_num(e.data, "prompts_lost") for e in faults)),
        prompts_duplicated=int(sum(_num(e.data, "prompts_duplicated") for e in faults)),
    )


def ledger(h: RunHistory) -> Ledger:
    """Where the wall time of every attempt in ``h`` went, and the run's goodput."""
    numbers = sorted({e.stamp.attempt for e in h.events} | {s.stamp.attempt for s in h.steps})
    events = {n: [e for e in h.events if e.stamp.attempt == n] for n in numbers}
    steps = {n: [s for s in h.steps if s.stamp.attempt == n] for n in numbers}
    newest: dict[int, LoggedStep] = {}  # step -> the newest attempt's own line of it (what the run kept)
    for n in numbers:
        for s in _own(events[n], steps[n]):
            newest[s.step] = s
    counts = {id(s) for s in newest.values()}
    attempts = [_attempt(n, events[n], steps[n], counts) for n in numbers]
    total = dict.fromkeys(BUCKETS, 0.0)
    for a in attempts:
        for k, v in a.seconds.items():
            total[k] += v
    for prev, nxt in itertools.pairwise(attempts):
        total["between_attempts"] += max(0.0, nxt.start_t - prev.end_t)
    retries = sum(1 for a in attempts[1:] if a.resumed)
    return Ledger(attempts, total, _faults(h.events), retries)
