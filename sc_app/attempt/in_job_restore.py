"""In-job restore: a dead trainer rank, TransferQueue storage unit or controller, controller actor or node costs what
died — not the attempt (on KubeRay: a new RayCluster, image pull, Ray start), and not a whole new job.

When driving the job fails because a process of it died (``JobFailed``; ``ActorsDied`` from the driver's watch), or
a set-up (the first one included) meets a death, ``drive_restoring``, in this order:

1. names what died (``RestorableJob.what_died``: kind, names, the GCS's time of death);
2. asks the named policy (``restore_policy.InJobRestorePolicy``) and ends the attempt when it says END (the job
   torn down, ``JobFailed`` with its one line, exit 1: the usual retry path): in-job restore off, the restores spent
   (``run.max_in_job_restores`` per attempt), a stop requested, or the cluster no longer fits the job;
3. fences the old job: the lease moves one epoch on (``Lease.advance``), so a zombie of it can never publish a
   bundle, and the new epoch is what every call to a kept worker carries from now on (``sc_app.rl.fencing``);
4. **warm** (``run.in_job_restore: warm``, the default): halts the controller actor in place (the progress it had
   not reported yet is collected first), plans again as the lease holder (the dead job's unfinished save is
   quarantined), and resets the job in place — only the dead actors and the data plane are started again
   (``sc_app.attempt.warm_reset``);
5. **full** (``run.in_job_restore: full``, or when the warm reset fails or times out): tears the whole job down,
   plans again and sets it up in the seed's restore order, as a start would;
6. reports one ``FaultRecord`` per death (``restored_step``, the path that ran, the actors restarted and reset, the
   seconds of each phase). A death during a restore is a death of its own: the interrupted restore's event says
   so (``outcome: interrupted``) and the next restore — counted against the same bound — covers both.

If the full rebuild fails other than by a death, the attempt ends (its error: exit 1). A restore never deletes or
overwrites a bundle, and no bundle is cut until the controller's ``restore()`` checked its index. Pure logic over
the ``RestorableJob`` protocol: ``sc_app.attempt.run`` binds it to Ray; unit tests bind it to fakes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from sc_app.attempt.restore_policy import Action, Death, InJobRestorePolicy
from sc_app.checkpoint import ResumePlan
from sc_app.progress import FaultRecord, JobFailed, RunSummary

log = logging.getLogger(__name__)


class ResetFailed(RuntimeError):
    """A warm reset failed or timed out (a live actor erred, or did not answer): the full rebuild runs instead."""


@dataclass
class Reset:
    """What a warm reset reports (``RestorableJob.reset``): the processes started again and reset in place, the
    seconds of its phases and the calls of older epochs refused."""

    restarted: list[str] = field(default_factory=list)
    reset: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    refused: int = 0


class RestorableJob(Protocol):
    def start(self, plan: ResumePlan) -> tuple[Any, ResumePlan]: ...  # a Setup (teardown()) and the plan used
    def drive(self, setup: Any) -> RunSummary: ...
    def what_died(self, setup: Any, exc: JobFailed) -> Death: ...
    def missing_resources(self) -> str | None: ...  # None when the cluster still fits the job
    def fence(self) -> int: ...  # the new fencing epoch
    def halt(self, setup: Any) -> Any: ...  # warm: stop the controller in place (ResetFailed); its result → reset
    def reset(self, setup: Any, plan: ResumePlan, halted: Any, epoch: int) -> tuple[Any, Reset]: ...
    def replan(self) -> ResumePlan: ...
    def step_reached(self) -> int: ...  # the newest step the driven job reported
    def stop_requested(self) -> bool: ...
    def on_fault(self, record: FaultRecord) -> None: ...


@dataclass
class _Restore:
    """One restore under way: the death it answers and its clock."""

    death: Death
    detected: float
    reached: int
    seconds: dict[str, float] = field(default_factory=dict)
    path: str = "warm"

    def lap(self, phase: str, since: float) -> float:
        now = time.time()
        self.seconds[phase] = self.seconds.get(phase, 0.0) + now - since
        return now

    def record(self, plan: ResumePlan | None, outcome: str, reset: Reset | None = None, error: str = "") -> FaultRecord:
        death, reached = self.death, self.reached
        seconds = {"detection": self.detection, **self.seconds}
        return FaultRecord(
            step=reached,
            kind=death.kind,
            outcome=outcome,
            attempts=1,
            detection_seconds=self.detection,
            recovery_seconds=time.time() - self.detected,
            steps_redone=max(0, reached - plan.step) if plan is not None and outcome == "recovered" else 0,
            restored_step=plan.step if plan is not None else None,
            error=error or death.error,
            path=self.path,
            restarted=tuple(reset.restarted) if reset else (("every actor of the job",) if self.path != "warm" else ()),
            reset=tuple(reset.reset) if reset else (),
            phase_seconds={k: round(v, 3) for k, v in seconds.items()},
            stale_refused=reset.refused if reset else 0,
        )

    @property
    def detection(self) -> float:
        return max(0.0, self.detected - self.death.died_at) if self.death.died_at else 0.0


def drive_restoring(
    job: RestorableJob, plan: ResumePlan, max_restores: int, *, warm: bool = True
) -> tuple[RunSummary, ResumePlan]:
    """Set the job up from ``plan`` and drive it to its end, restoring it in-job after each death (at most
    ``max_restores``; ``warm``: reset in place first). Returns the summary and the plan the last setup used."""
    policy = InJobRestorePolicy(max_restores)
    restores = 0
    failure: JobFailed | None = None
    try:
        setup, plan = job.start(plan)
    except JobFailed as exc:  # a death during the first set-up is a death like any other
        setup, failure = _Nothing(), exc
    while True:
        if failure is None:
            try:
                return job.drive(setup), plan
            except JobFailed as exc:
                failure = exc
        death = job.what_died(setup, failure)
        restore = _Restore(death, time.time(), job.step_reached())
        decision = policy.decide(
            death, restores, stop_requested=job.stop_requested, missing_resources=job.missing_resources
        )
        if decision.action is Action.END:
            setup.teardown()
            if decision.line is None:  # in-job restore is off: the death's own error ends the attempt
                raise failure
            raise JobFailed(decision.line) from None
        restores += 1
        log.warning("%s died (%s); restoring in-job (%d of %d)", death.names, death.kind, restores, max_restores)
        setup, plan, failure = _restore(job, setup, restore, warm and not isinstance(setup, _Nothing))


def _restore(job: RestorableJob, setup: Any, restore: _Restore, warm: bool) -> tuple[Any, ResumePlan, JobFailed | None]:
    """Fence, then the warm reset (when ``warm``) or the full rebuild; reports the death's event. Returns the setup
    to drive, its plan, and the death that interrupted this restore (None when it stood)."""
    since = time.time()
    epoch = job.fence()
    since = restore.lap("fencing", since)
    plan: ResumePlan | None = None
    if warm:
        try:
            halted = job.halt(setup)
            restore.reached = max(restore.reached, job.step_reached())  # the steps the halted controller handed on
            plan = job.replan()
            since = restore.lap("fencing", since)
            setup, reset = job.reset(setup, plan, halted, epoch)
            restore.seconds.update(reset.seconds)
            job.on_fault(restore.record(plan, "recovered", reset))
            return setup, plan, None
        except ResetFailed as exc:
            log.warning("warm in-job restore failed (%s); rebuilding the whole job", exc)
            restore.path = f"full (warm reset failed: {exc})"
        except JobFailed as exc:  # another death while resetting
            return _interrupted(job, setup, restore, plan, exc)
    else:
        restore.path = "full"
        if not isinstance(setup, _Nothing):
            _hand_on_unpolled(job, setup, restore)
    setup.teardown()
    since = restore.lap("reset", since)
    try:
        plan = job.replan() if plan is None else plan
        setup, plan = job.start(plan)
    except JobFailed as exc:
        return _interrupted(job, _Nothing(), restore, plan, exc)
    restore.lap("reload", since)
    job.on_fault(restore.record(plan, "recovered"))
    return setup, plan, None


def _hand_on_unpolled(job: RestorableJob, setup: Any, restore: _Restore) -> None:
    """The full path halts a live controller too, before tearing it down: the steps it trained since the driver's
    last poll are handed on and counted as redone (else the fault claims fewer than the trace shows). A controller
    that will not halt is torn down as it is."""
    try:
        job.halt(setup)
    except ResetFailed as exc:
        log.warning("the controller did not hand on its last progress before the rebuild (%s)", exc)
        return
    restore.reached = max(restore.reached, job.step_reached())


def _interrupted(
    job: RestorableJob, setup: Any, restore: _Restore, plan: ResumePlan | None, exc: JobFailed
) -> tuple[Any, ResumePlan, JobFailed]:
    """This restore met another death: its own event says so; the next restore (of the new death) covers both."""
    job.on_fault(restore.record(plan, "interrupted", error=f"{restore.death.error}; its restore met another death"))
    return setup, plan or ResumePlan("fresh", "no plan yet"), exc


class _Nothing:
    """No setup left to tear down (the failed start tore its own down)."""

    def teardown(self) -> None:
        return None
