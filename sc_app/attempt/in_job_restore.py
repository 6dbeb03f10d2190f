"""In-job restore: a dead trainer rank, TransferQueue storage unit or controller, controller actor or node costs a
rebuild on the same Ray cluster — not the attempt (on KubeRay: a new RayCluster, image pull, Ray start).

When driving the job fails because a process of it died (``JobFailed``; ``ActorsDied`` from the driver's watch),
``drive_restoring``, in this order:

1. names what died (``RestorableJob.what_died``) and tears the whole job down (every actor killed, TransferQueue
   closed, the restore guard gone: ``Setup.teardown``);
2. asks the named policy (``restore_policy.InJobRestorePolicy``) and ends the attempt when it says END
   (``JobFailed``, its one line, exit 1: the usual retry path): in-job restore off, the restores spent
   (``run.max_in_job_restores`` per attempt), a stop requested, or the cluster no longer fits the job (the line
   names what is missing: a node gone for good);
3. fences the torn-down job: the lease moves one epoch on (``Lease.advance``), so a zombie of it (a process on a
   partitioned node that outlived ``ray.kill``) fails its next lease check and can never publish a bundle; it
   cannot write rows either — the data plane it knew was closed and its actors killed;
4. plans again as a fresh attempt would (the newest bundle that verifies, the holder's tidy of leftovers such as
   the dead job's unfinished save) and sets the job up in the seed's restore order; the rebuilt controller starts
   from that bundle, so the steps trained since it are redone;
5. reports a ``FaultRecord`` (``restored_step`` set): detection and recovery seconds, steps to redo.

A restore never deletes or overwrites a bundle (an unfinished save was never renamed; tidying is the holder's
usual tidy), and no bundle is cut until the rebuilt controller's ``restore()`` checked its index. Pure logic over
the ``RestorableJob`` protocol: ``sc_app.attempt.run`` binds it to Ray; unit tests bind it to fakes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from sc_app.attempt.restore_policy import Action, Death, InJobRestorePolicy
from sc_app.checkpoint import ResumePlan
from sc_app.progress import FaultRecord, JobFailed, RunSummary

log = logging.getLogger(__name__)


class RestorableJob(Protocol):
    def start(self, plan: ResumePlan) -> tuple[Any, ResumePlan]: ...  # a Setup (teardown()) and the plan used
    def drive(self, setup: Any) -> RunSummary: ...
    def what_died(self, setup: Any, exc: JobFailed) -> Death: ...
    def missing_resources(self) -> str | None: ...  # None when the cluster still fits the job
    def fence(self) -> None: ...
    def replan(self) -> ResumePlan: ...
    def step_reached(self) -> int: ...  # the newest step the driven job reported
    def stop_requested(self) -> bool: ...
    def on_fault(self, record: FaultRecord) -> None: ...


def drive_restoring(job: RestorableJob, plan: ResumePlan, max_restores: int) -> tuple[RunSummary, ResumePlan]:
    """Set the job up from ``plan`` and drive it to its end, restoring it in-job after each death (at most
    ``max_restores``). Returns the summary and the plan the last setup used."""
    policy = InJobRestorePolicy(max_restores)
    restores = 0
    setup, plan = job.start(plan)
    while True:
        try:
            return job.drive(setup), plan
        except JobFailed as exc:
            failure = exc
        while True:  # the rebuild itself can meet a death too: each try counts
            detected = time.time()
            death = job.what_died(setup, failure)
            setup.teardown()
            torn_down = time.time()
            reached = job.step_reached()
            decision = policy.decide(
                death, restores, stop_requested=job.stop_requested, missing_resources=job.missing_resources
            )
            if decision.action is Action.END:
                if decision.line is None:  # in-job restore is off: the death's own error ends the attempt
                    raise failure
                raise JobFailed(decision.line) from None
            restores += 1
            log.warning("%s died (%s); restoring in-job (%d of %d)", death.names, death.kind, restores, max_restores)
            job.fence()
            plan = job.replan()
            try:
                setup, plan = job.start(plan)
            except JobFailed as exc:
                failure, setup = exc, _Nothing()
                continue
            break
        set_up = time.time() - torn_down
        log.info("in-job restore: torn down in %.1fs, set up again in %.1fs", torn_down - detected, set_up)
        job.on_fault(
            FaultRecord(
                step=reached,
                kind=death.kind,
                outcome="recovered",
                attempts=1,
                detection_seconds=max(0.0, detected - death.died_at) if death.died_at else 0.0,
                recovery_seconds=time.time() - detected,
                steps_redone=max(0, reached - plan.step),
                restored_step=plan.step,
                error=f"{death.names} died",
            )
        )


class _Nothing:
    """No setup left to tear down (the failed start tore its own down)."""

    def teardown(self) -> None:
        return None
