"""Deadline-aware emergency saves: cut a bundle on a stop request only when it can finish in the time left.

A preemption notice is short (GKE graceful node shutdown gives ordinary pods ~15 s, Azure 30 s, AWS 2 min; see
ops/README.md) and a bundle that does not finish in it is lost work *and* lost time: it is never published (only its
final rename publishes), and the save runs up to the SIGKILL. So the driver compares how long its recent saves took
with what is left of ``checkpoint.emergency_budget_s`` and starts the emergency bundle only when it fits; otherwise it
says so, and the newest periodic bundle stays the resume point — ``checkpoint.save_period`` is then the real
protection, which ``slow_save`` says whenever a save takes longer than ``checkpoint.preemption_notice_s``.

Pure: no Ray, no torch, no clock of its own (callers pass times).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SAFETY = 1.25  # a save under the stop's pressure is not faster than the ones before it
HISTORY = 3  # the newest saves that predict the next one
END_MARGIN_S = 2.0  # of a stop's budget, kept for the controller's end to reach the driver


@dataclass(frozen=True)
class EmergencyPlan:
    start: bool
    estimate_s: float | None  # None: no save finished yet, nothing to go by
    left_s: float
    line: str


def plan_emergency(recent_save_s: Sequence[float], left_s: float, *, newest_bundle: str | None) -> EmergencyPlan:
    """Whether an emergency bundle started now finishes within ``left_s`` seconds, judged by the slowest of the
    newest ``HISTORY`` saves times ``SAFETY``; with no save history it is tried (nothing says it cannot fit)."""
    keep = f"the newest bundle {newest_bundle} stays the resume point" if newest_bundle else "there is no bundle yet"
    if left_s <= 0:
        return EmergencyPlan(False, None, left_s, f"emergency bundle skipped: no time left of the budget; {keep}")
    recent = [s for s in recent_save_s if s >= 0][-HISTORY:]
    if not recent:
        return EmergencyPlan(True, None, left_s, f"emergency bundle: no save timed yet, trying within {left_s:.1f}s")
    estimate = max(recent) * SAFETY
    if estimate <= left_s:
        return EmergencyPlan(
            True,
            estimate,
            left_s,
            f"emergency bundle: ~{estimate:.1f}s expected, {left_s:.1f}s left of the stop's budget",
        )
    return EmergencyPlan(
        False,
        estimate,
        left_s,
        f"emergency bundle skipped: recent saves took up to {max(recent):.1f}s and only {left_s:.1f}s are left of "
        f"checkpoint.emergency_budget_s; {keep} (checkpoint.save_period is the protection here)",
    )


def in_flight_wait(recent_save_s: Sequence[float], left_s: float, *, same_step: bool) -> float:
    """How long a stop waits for the save in flight before abandoning it (never renamed; the next start quarantines
    its tmp dir). A save of the step reached is the bundle the stop wants: all of ``left_s`` but ``END_MARGIN_S``
    (the driver must still see the end before its deadline). One of an older step: until only what an emergency
    bundle needs is left, so that one can still be tried — half of ``left_s`` when no save was timed yet."""
    if left_s <= 0:
        return 0.0
    if same_step:
        return max(0.0, left_s - min(END_MARGIN_S, left_s / 5))
    recent = [s for s in recent_save_s if s >= 0][-HISTORY:]
    if not recent:
        return left_s / 2
    return max(0.0, left_s - max(recent) * SAFETY)


def slow_save(step: int, seconds: float, notice_s: float | None) -> str | None:
    """A warning when a save took longer than the preemption notice the platform gives, else None."""
    if notice_s is None or seconds <= notice_s:
        return None
    return (
        f"save of step_{step} took {seconds:.1f}s, longer than checkpoint.preemption_notice_s={notice_s:g}s: a "
        "preemption notice cannot cover an emergency bundle, so checkpoint.save_period is your real protection "
        "(lower it, or make saves faster)"
    )


def progress_notes(record: object, notice_s: float | None) -> list[str]:
    """Lines the driver prints after a progress record: the stop's emergency decision, a save slower than the
    preemption notice. Duck-typed on the records of ``sc_app.progress`` (this module imports neither Ray nor torch)."""
    notes = [str(record.emergency)] if getattr(record, "emergency", None) and isinstance(record.emergency, str) else []
    seconds = getattr(record, "seconds", None)
    if isinstance(seconds, float) and hasattr(record, "bundle"):
        warning = slow_save(int(getattr(record, "step", 0)), seconds, notice_s)
        notes += [f"warning: {warning}"] if warning else []
    return notes
