"""``ClusterJob``: ``in_job_restore.RestorableJob`` on this process's Ray — set up, drive (watching the job's
actors), name a death, fence through the lease keeper, halt and reset in place (``warm_reset``), plan again as the
lease holder."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray

from sc_app.attempt import cluster_fit, restore_scope
from sc_app.attempt.actor_watch import (
    CONTROLLER,
    NODE,
    ActorsDied,
    DeadActor,
    JobActors,
    is_actor_death,
    kind_of_error,
    live_node_resources,
)
from sc_app.attempt.in_job_restore import Reset, ResetFailed
from sc_app.attempt.poll import drive
from sc_app.attempt.restore_policy import Death
from sc_app.attempt.restore_scope import unfound_line
from sc_app.attempt.spares import Spares
from sc_app.attempt.warm_reset import JobIdentity, WarmReset, actors_died_during_reset, halt_controller
from sc_app.checkpoint import ResumePlan
from sc_app.progress import FaultRecord, JobFailed, ProgressRecord, RunSummary, SaveRecord, StepRecord
from sc_app.rl.factory import prepare_policy_check
from sc_app.waits import Bound, ProcessHung, bounded

if TYPE_CHECKING:
    from sc_app.attempt.setup import Setup

log = logging.getLogger(__name__)

NODE_DEATH_WAIT_S = 30.0  # how long an in-job restore waits to learn which of the job's actors died, and where
DRAIN_TIMEOUT_S = 10.0  # how long a halted controller may take to hand over the progress the driver had not polled
PROBE_S = 10.0  # after a hang, how long each process has to answer the probe (at most run.hang_timeout_s)


def drained_after_halt(records: list[ProgressRecord], *, after_hang: bool) -> list[ProgressRecord]:
    """What a halted controller's unpolled progress hands on. After a hang, no step record: the job reported nothing
    for ``run.hang_timeout_s`` before it was declared hung, so a step that finished since (its hung process killed,
    its call then answered) holds the frozen seconds — never training in the goodput ledger; the restored job
    trains it again from the bundle. After a death every record is kept (a step trained just before it)."""
    if not after_hang:
        return list(records)
    kept = [r for r in records if not isinstance(r, StepRecord)]
    if len(kept) < len(records):
        log.info("after the hang: %d step record(s) of the halted controller not logged", len(records) - len(kept))
    return kept


class ClusterJob:
    """The attempt's job on Ray (the module docstring). ``attempt``: ``run.Attempt`` (not imported: ``run``
    imports this module); ``start``: ``run.start_controller``."""

    def __init__(
        self,
        attempt: Any,
        stop_requested: Callable[[], bool],
        start: Callable[[Any, ResumePlan], tuple[Setup, ResumePlan]],
    ) -> None:
        self.attempt, self.stop_requested, self._start = attempt, stop_requested, start
        self._step = 0
        self._seen = 0  # progress records of the driven controller handed on
        self._epoch = 0  # the fencing epoch without a lease (checkpoint.enabled=false)
        self._watch: JobActors | None = None  # the driven setup's actors (None while a setup is being built)
        self.plan: ResumePlan | None = None  # the plan of the newest set-up started
        self._hung: list[DeadActor] = []  # the driven setup's processes killed as hung (what_died), dead from then on
        self._unfound: str | None = None  # a hang the probe found no process of: the full rebuild runs (halt)
        self._check_prepared = False  # the policy check's template built (once per process)
        self.spares = Spares(attempt.cfg)  # trainer.spare_ranks: filled after each set-up and warm reset

    def start(self, plan: ResumePlan) -> tuple[Setup, ResumePlan]:
        """Set up from ``plan``; each wait ends on a stop (StopCut) or past run.setup_timeout_s (ProcessHung)."""
        self._watch, self.plan = None, plan
        limit = self.attempt.cfg.run.setup_timeout_s
        self.spares.drop_unplaced()
        with bounded(Bound.within(limit, self.stop_requested, why=f"set-up past run.setup_timeout_s={limit:g}s")):
            setup, plan = self._start(self.attempt, plan)
        self._step = plan.step if plan.decision == "resume" else 0
        self.plan = plan
        self.spares.fill()
        return setup, plan

    def drive(self, setup: Setup) -> RunSummary:
        assert setup.policy is not None
        self._watch = JobActors.of(setup.policy.trainers, setup.actor, setup.policy.generators)
        self._seen, self._hung, self._unfound = 0, [], None
        return drive(
            setup.actor,
            emergency_budget_s=self.attempt.cfg.checkpoint.emergency_budget_s,
            on_progress=self._progress,
            stop_requested=self.stop_requested,
            watch=self._watch.check,
            hang_s=self.attempt.cfg.run.hang_timeout_s,
        )

    def _progress(self, record: ProgressRecord) -> None:
        self._seen += 1
        if isinstance(record, StepRecord):
            self._step = max(self._step, record.step)
        self.attempt.calls.on_progress(record)
        if isinstance(record, SaveRecord) and not record.emergency:
            self._prepare_policy_check()

    def _prepare_policy_check(self) -> None:
        """Once the first bundle landed (there is one to restore to), build what a restore's re-plan checks it
        against while the job trains on (``prepare_policy_check``: 1-3 s the first time in a process), not after a
        death. Only where an in-job restore may follow; a failure here is the check's to report, later."""
        if self._check_prepared or self.attempt.cfg.run.max_in_job_restores == 0:
            return
        self._check_prepared = True
        try:
            prepare_policy_check(self.attempt.cfg)
        except Exception as exc:
            log.debug("the policy check's template was not built ahead (%s)", exc)

    def what_died(self, setup: Setup, exc: JobFailed) -> Death:
        """From the driven setup's watch; a death while a setup was being built (no watch) is named by its error:
        the actor class Ray's error names gives its kind; a hung process is found and killed (``_kill_hung``)."""
        if isinstance(exc, ProcessHung):
            return self._kill_hung(setup, exc)
        if not isinstance(exc, ActorsDied) and self._watch is not None:
            # the death surfaced as an error first; the GCS records it at once for a dead process, only after its
            # health check for a lost node (Ray's default: about 15 s) — and the fit check needs the node gone
            dead = self._watch.wait_dead(NODE_DEATH_WAIT_S)
            exc = ActorsDied(dead) if dead else exc
        if isinstance(exc, ActorsDied):
            if any(d.kind == CONTROLLER for d in exc.dead):
                self._steps_of_dead_controller(setup)
            known = [d.died_at for d in exc.dead if d.died_at is not None]
            names = ", ".join(d.name for d in exc.dead) + (" (their node is gone)" if exc.kind == NODE else "")
            return Death(exc.kind, names, min(known) if known else None)
        return Death(kind_of_error(str(exc)) or CONTROLLER, "a process of the job", line=str(exc))

    def _kill_hung(self, setup: Setup, exc: ProcessHung) -> Death:
        """The processes of the driven job that do not answer the probe (``restore_scope.hung``), killed: from here
        on they are dead ones, restarted by the warm reset while the rest are reset in place. A hung controller is
        a dead controller (its last steps from trainer rank 0). None found: the full rebuild runs (``halt``)."""
        if self._watch is None:  # hung while a setup was being built: the full rebuild kills what it started
            return Death(exc.kind, exc.names, exc.since)
        seconds = min(PROBE_S, self.attempt.cfg.run.hang_timeout_s)
        silent = restore_scope.hung(self._watch.actors, self._watch.probe(seconds), exc.kind)
        self._hung = self._watch.kill_hung(silent, exc.since)
        if not self._hung:
            self._unfound = unfound_line(seconds)
            log.warning("%s: %s", exc, self._unfound)
            return Death(exc.kind, exc.names, exc.since)
        if any(d.kind == CONTROLLER for d in self._hung):
            self._steps_of_dead_controller(setup)
        names = ", ".join(d.name for d in self._hung)
        return Death(exc.kind, names, exc.since, line=f"{names} hung ({exc}; no answer within {seconds:g}s): killed")

    def _steps_of_dead_controller(self, setup: Setup) -> None:
        """A dead controller takes the steps it trained since the driver's last poll with it; trainer rank 0 kept
        a copy of each step record: they reach the run log, and the steps to redo are counted (issue 31 C)."""
        try:
            assert setup.policy is not None
            kept = ray.get(setup.policy.trainers[0].kept_progress.remote(self._step), timeout=DRAIN_TIMEOUT_S)
        except Exception:  # rank 0 dead too, or busy: the driver's own count stands
            log.info("could not collect the dead controller's last steps from trainer rank 0", exc_info=True)
            return
        for record in kept:
            self._progress(record)

    def missing_resources(self) -> str | None:
        return cluster_fit.unfit_line(cluster_fit.job_demands(self.attempt.cfg), live_node_resources())

    def fence(self) -> int:
        if self.attempt.keeper is not None:
            self.attempt.lease = self.attempt.keeper.advance()
            return self.attempt.lease.fencing_epoch
        self._epoch += 1
        return self._epoch

    def halt(self, setup: Setup) -> list[Any] | None:
        """Stop the controller's run in place and collect the progress the driver had not polled yet (so a step
        trained just before the death still reaches the run log); its generation workers, None when it is dead or
        was killed as hung (no wait on it). A hang that named no process: ``ResetFailed``, the full rebuild runs."""
        if self._unfound is not None:
            raise ResetFailed(self._unfound)
        if any(d.kind == CONTROLLER for d in self._hung):
            return None
        generators = halt_controller(setup.actor, self.attempt.cfg.run.reset_timeout_s)
        if generators is not None:
            try:
                drained = ray.get(setup.actor.progress.remote(self._seen), timeout=DRAIN_TIMEOUT_S)
                for record in drained_after_halt(drained, after_hang=bool(self._hung)):
                    self._progress(record)
            except Exception:  # progress is a report: a restore does not wait on it
                log.warning("could not collect the halted controller's last progress", exc_info=True)
        return generators

    def reset(self, setup: Setup, plan: ResumePlan, halted: Any, epoch: int) -> tuple[Setup, Reset]:
        attempt = self.attempt
        link = attempt.remote.link() if attempt.remote is not None else None
        who = JobIdentity(attempt.run_id, attempt.lease, attempt.rules.lineage, attempt.dataset, link)
        gone = frozenset(d.actor_id for d in self._gone())
        warm = WarmReset(attempt.cfg, who, epoch, attempt.cfg.run.reset_timeout_s, gone=gone, spares=self.spares)
        # a lost node's survivors elsewhere stay; no watch (a death before the drive): the data plane is rebuilt
        keep = self._watch is not None and restore_scope.scope(self._watch.actors, gone).keep_data_plane
        try:
            setup, report = warm.run(setup, plan, halted, keep_data_plane=keep)
        except (ResetFailed, JobFailed):
            raise
        except Exception as exc:
            if is_actor_death(exc):  # another death while resetting: named by the GCS
                log.warning("a process died during the warm reset: %s", str(exc).splitlines()[0][:300])
                self._watch = None  # it names the old job's actors (the dead ones replaced already)
                died = actors_died_during_reset(setup, controller_was_dead=halted is None)
                raise died or JobFailed(f"a process of the job died during a warm restore ({exc})") from None
            raise ResetFailed(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}") from exc
        self._watch, self._hung = None, []
        self._step = plan.step if plan.decision == "resume" else 0
        self.spares.fill()  # the spare that took a rank's place is replaced while the job trains on
        return setup, report

    def _gone(self) -> list[DeadActor]:
        """The driven setup's dead processes: those killed as hung, and those the GCS lists as dead."""
        if self._watch is None:
            return list(self._hung)
        killed = {d.actor_id for d in self._hung}
        return [*self._hung, *(d for d in self._watch.dead() if d.actor_id not in killed)]

    def replan(self) -> ResumePlan:
        return self.attempt.plan("restore")

    def step_reached(self) -> int:
        return self._step

    def on_fault(self, record: FaultRecord) -> None:
        self.attempt.calls.on_progress(record)
