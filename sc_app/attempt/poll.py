"""Driving the controller to its end: progress handed over in order, a stop request turned into an emergency
bundle within its budget, a hung job noticed, and Ray's errors turned into what the job means by them.

No wait here outlives its bound (``sc_app.waits``): the driver waits in short slices, so a stop request and the
emergency deadline are looked at every poll whatever the job does. Two heartbeats tell a hung job from a slow one
(``Heartbeat``): the controller actor answers the driver's progress call (a SIGSTOPped or deadlocked controller
does not), and the job reports a step, a save or a fault (a hung trainer rank, storage unit or TransferQueue
controller leaves the controller waiting on it). Either silent for ``run.hang_timeout_s`` ends the drive with
``ProcessHung``, a ``JobFailed``: the in-job restore treats it like a dead process. While a stop is being served
the emergency budget alone bounds the drive.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ray

from sc_app import waits
from sc_app.progress import JobFailed, ProgressRecord, RunSummary

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the driver collects progress and checks for a stop request
HANG = "hang"  # the FaultRecord kind of a job that reported nothing for run.hang_timeout_s (a process of it hangs)


class EmergencyTimeout(RuntimeError):
    """The stop request's emergency checkpoint did not finish inside ``checkpoint.emergency_budget_s``."""


DEATH_GRACE_S = 5.0  # how long a foreign error waits for the GCS to report a death behind it
LAST_RECORDS_S = 2.0  # how long a drive ended by a fault waits for the controller's records no poll collected


@contextmanager
def job_errors(watch: Callable[[], None] = lambda: None, grace_s: float = DEATH_GRACE_S) -> Iterator[None]:
    """Ray's errors out of the controller → what the job means by them: a dead process is ``JobFailed``; a task
    error is re-raised as the exception the controller raised (``LeaseLost``, ``SaveFailed``, ...). An error that is
    not sc-app's own (a survivor's collective failing on its dead peer: gloo's "Connection reset by peer") can
    reach the driver before the GCS records the death behind it: ``watch`` is asked for ``grace_s`` first, and
    the death it raises (``ActorsDied``, a ``JobFailed``: restored in-job) wins over the error."""
    try:
        yield
    except ray.exceptions.RayActorError as exc:
        raise JobFailed(
            f"the controller actor died ({type(exc).__name__}); rerun to resume from the newest complete bundle"
        ) from None
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        if isinstance(cause, ray.exceptions.RayActorError):
            raise JobFailed(
                f"a worker died ({type(cause).__name__}); rerun to resume from the newest complete bundle"
            ) from None
        if not type(cause).__module__.startswith("sc_app"):
            death_behind(watch, grace_s)
        raise cause from None


def death_behind(
    watch: Callable[[], None], grace_s: float, clock: Callable[[], float] = time.monotonic, pause_s: float = 0.5
) -> None:
    """``watch()`` every ``pause_s`` for ``grace_s``: returns when it raised nothing (no process of the job died)."""
    end = clock() + grace_s
    while True:
        watch()
        if clock() >= end:
            return
        time.sleep(pause_s)


@dataclass
class Heartbeat:
    """The two heartbeats of a driven job (module docstring), on ``clock`` (``time.monotonic``). Pure."""

    hang_s: float
    clock: Callable[[], float] = time.monotonic
    asked_at: float | None = None  # when the unanswered progress call was issued (None: none in flight)
    last_record: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.last_record = self.clock()

    def asked(self) -> None:
        self.asked_at = self.clock()

    def answered(self, records: int) -> None:
        self.asked_at = None
        if records:
            self.last_record = self.clock()

    def silent(self) -> waits.ProcessHung | None:
        """Which heartbeat stopped for longer than ``hang_s``, as the error that ends the drive; None: both beat."""
        now, why = self.clock(), f"no answer within run.hang_timeout_s={self.hang_s:g}s"
        if self.asked_at is not None and now - self.asked_at > self.hang_s:
            return waits.ProcessHung("controller", "the controller actor", now - self.asked_at, why)
        if now - self.last_record > self.hang_s:
            return waits.ProcessHung(
                HANG,
                "the job (no step, save or fault reported: a trainer rank, a data-plane process or a generation "
                "worker hangs)",
                now - self.last_record,
                f"run.hang_timeout_s={self.hang_s:g}s",
            )
        return None

    def silent_for(self) -> float:
        return 0.0 if self.asked_at is None else self.clock() - self.asked_at


@dataclass
class _HandOver:
    """Hands records to ``on_progress`` in order; ``seen``: how many so far (the next progress call's ``since``)."""

    on_progress: Callable[[ProgressRecord], None]
    seen: int = 0

    def __call__(self, records: list[ProgressRecord]) -> None:
        for record in records:
            self.seen += 1
            self.on_progress(record)


def drive(
    actor: Any,
    *,
    emergency_budget_s: float,
    on_progress: Callable[[ProgressRecord], None],
    stop_requested: Callable[[], bool],
    poll_seconds: float = POLL_SECONDS,
    watch: Callable[[], None] = lambda: None,
    hang_s: float = 300.0,
) -> RunSummary:
    """Run the controller to its end, handing every progress record to ``on_progress`` in order. Once
    ``stop_requested()`` is true the controller is asked to stop (finish the step, cut a bundle of it) and given
    ``emergency_budget_s``; past that it is killed — nothing half-written is renamed, so the newest older bundle
    stays the resume point — and ``EmergencyTimeout`` is raised. ``watch`` is called every poll: it raises
    (``ActorsDied``) when an actor of the job died in a way no call would report; a silent heartbeat raises
    ``ProcessHung``. A drive that a fault ends (``JobFailed``) first hands over what the controller recorded and
    no poll had collected yet — a save committed an instant before the death — if the controller still answers
    within ``LAST_RECORDS_S``: a restore or an attempt's end never drops the record of work that was done."""
    beat, hand_over = Heartbeat(hang_s), _HandOver(on_progress)
    try:
        with job_errors(watch):
            return _polled(actor, emergency_budget_s, hand_over, stop_requested, poll_seconds, watch, beat)
    except JobFailed:
        if beat.silent_for() < LAST_RECORDS_S:  # else its last progress call is unanswered already: it hangs
            _last_records(actor, hand_over)
        raise


def _polled(
    actor: Any,
    emergency_budget_s: float,
    hand_over: _HandOver,
    stop_requested: Callable[[], bool],
    poll_seconds: float,
    watch: Callable[[], None],
    beat: Heartbeat,
) -> RunSummary:
    """``drive``'s loop: one poll every ``poll_seconds`` until the controller's ``run`` returns."""
    deadline: float | None = None

    def ask_stop() -> float:
        actor.request_stop.remote(time.time() + emergency_budget_s)
        return time.monotonic() + emergency_budget_s

    if stop_requested():  # asked before training started (e.g. SIGTERM while Ray started): train nothing
        deadline = ask_stop()
    ref, asking = actor.run.remote(), None
    while True:
        ready, _ = ray.wait([ref], timeout=poll_seconds)
        if ready:  # every record up to the end: calls to an actor run in order, so one asked now has them all
            last = actor.progress.remote(hand_over.seen)
            hand_over(waits.get(last, what="the controller actor", bound=_end(deadline, beat.hang_s)))
            return ray.get(ref)
        if asking is None:
            asking = actor.progress.remote(hand_over.seen)
            beat.asked()
        if ray.wait([asking], timeout=poll_seconds)[0]:
            records = ray.get(asking)
            asking = None
            beat.answered(len(records))
            hand_over(records)
        watch()
        if deadline is None and stop_requested():
            deadline = ask_stop()
        if deadline is None and (hung := beat.silent()) is not None:
            raise hung
        if deadline is not None and time.monotonic() > deadline:
            ray.kill(actor)
            raise EmergencyTimeout(_timeout_line(emergency_budget_s, beat.silent_for()))


def _last_records(actor: Any, hand_over: _HandOver) -> None:
    """The controller's records no poll collected, handed over if it answers within ``LAST_RECORDS_S``; a controller
    that is dead or hung (the fault itself, perhaps) has none to give, and the fault goes on as it is."""
    try:
        last = actor.progress.remote(hand_over.seen)
        records = waits.get(last, what="the controller actor", bound=waits.Bound.within(LAST_RECORDS_S))
    except Exception as exc:  # dead, hung or unreachable: nothing more can be collected
        log.debug("the controller's last records could not be collected: %s", type(exc).__name__)
        return
    hand_over(records)


def _end(deadline: float | None, hang_s: float) -> waits.Bound:
    """The bound of the last progress call: the emergency deadline while stopping, else ``run.hang_timeout_s``."""
    if deadline is not None:
        return waits.Bound(max(deadline, time.monotonic() + 1.0), why="the emergency budget ran out")
    return waits.Bound.within(hang_s, why=f"run.hang_timeout_s={hang_s:g}s")


def _timeout_line(budget_s: float, silent_s: float) -> str:
    hung = f" (the controller actor had not answered for {silent_s:.0f}s: hung)" if silent_s > 2 * POLL_SECONDS else ""
    return (
        f"emergency checkpoint did not finish within checkpoint.emergency_budget_s={budget_s:g}s{hung}; "
        "the newest older bundle stays the resume point"
    )
