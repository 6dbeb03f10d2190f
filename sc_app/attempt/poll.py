"""Driving the controller to its end: progress handed over in order, a stop request turned into an emergency
bundle within its budget, and Ray's errors turned into what the job means by them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import ray

from sc_app.progress import JobFailed, ProgressRecord, RunSummary

POLL_SECONDS = 0.5  # how often the driver collects progress and checks for a stop request


class EmergencyTimeout(RuntimeError):
    """The stop request's emergency checkpoint did not finish inside ``checkpoint.emergency_budget_s``."""


@contextmanager
def job_errors() -> Iterator[None]:
    """Ray's errors out of the controller → what the job means by them: a dead process is ``JobFailed``; a task
    error is re-raised as the exception the controller raised (``LeaseLost``, ``SaveFailed``, ...)."""
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
        raise cause from None


def drive(
    actor: object,
    *,
    emergency_budget_s: float,
    on_progress: Callable[[ProgressRecord], None],
    stop_requested: Callable[[], bool],
    poll_seconds: float = POLL_SECONDS,
    watch: Callable[[], None] = lambda: None,
) -> RunSummary:
    """Run the controller to its end, handing every progress record to ``on_progress`` in order. Once
    ``stop_requested()`` is true the controller is asked to stop (finish the step, cut a bundle of it) and given
    ``emergency_budget_s``; past that it is killed — nothing half-written is renamed, so the newest older bundle
    stays the resume point — and ``EmergencyTimeout`` is raised. ``watch`` is called every poll: it raises
    (``ActorsDied``) when an actor of the job died in a way no call would report."""
    deadline: float | None = None
    if stop_requested():  # asked before training started (e.g. SIGTERM while Ray started): train nothing
        ray.get(actor.request_stop.remote(time.time() + emergency_budget_s))  # type: ignore[attr-defined]
        deadline = time.monotonic() + emergency_budget_s
    ref = actor.run.remote()  # type: ignore[attr-defined]
    seen = 0
    with job_errors():
        while True:
            ready, _ = ray.wait([ref], timeout=poll_seconds)
            for record in ray.get(actor.progress.remote(seen)):  # type: ignore[attr-defined]
                seen += 1
                on_progress(record)
            if ready:
                return ray.get(ref)
            watch()
            if deadline is None and stop_requested():
                actor.request_stop.remote(time.time() + emergency_budget_s)  # type: ignore[attr-defined]
                deadline = time.monotonic() + emergency_budget_s
            if deadline is not None and time.monotonic() > deadline:
                ray.kill(actor)
                raise EmergencyTimeout(
                    f"emergency checkpoint did not finish within checkpoint.emergency_budget_s="
                    f"{emergency_budget_s:g}s; the newest older bundle stays the resume point"
                )
