"""One attempt of the training job: resume plan → writer lease → tidy → Ray → setup → drive → release.

``run_job`` is what ``sc-app run`` calls; each of its steps is one function here. Which bundle it resumes, and
whether it may, is ``sc_app.checkpoint.choose_bundle``'s decision (the same ``sc-app preflight`` prints), asked in
one place, ``Attempt.plan``, at each moment the attempt plans; the backend's input checks are
``sc_app.rl.hooks``'. Errors leave it typed: ``InputError`` / ``CheckpointDirUnusable`` / ``LeaseError`` /
``LineageError`` / ``ResumeRefused`` (bad input: exit 2), ``LeaseLost`` (superseded: exit 3), ``JobFailed`` /
``EmergencyTimeout`` / ``SaveFailed`` / ``InventoryMismatch`` (exit 1) — ``sc_app.exits`` maps them to exit codes,
the CLI maps ``RunResult.outcome``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import ray

from sc_app.attempt import ray_start
from sc_app.attempt.errors import RestoreFailed, ResumeRefused
from sc_app.attempt.in_job_restore import drive_restoring
from sc_app.attempt.remote_tier import RemoteTier, open_remote
from sc_app.checkpoint import BundleRules, ResumePlan, choose_bundle, layout, volume
from sc_app.checkpoint.dataset import DatasetRecord
from sc_app.checkpoint.lease import Lease, LeaseKeeper, LeaseLost, read_lease
from sc_app.checkpoint.lineage import ensure_lineage
from sc_app.checkpoint.stop_request import StopWatch
from sc_app.config.app import AppConfig
from sc_app.progress import ProgressRecord, RunSummary
from sc_app.rl import hooks
from sc_app.waits import StopCut

if TYPE_CHECKING:  # the set-up's modules load torch, tensordict and the workers' code: imported once Ray is up
    from sc_app.attempt.setup import Setup

log = logging.getLogger(__name__)


class CheckpointDirUnusable(RuntimeError):
    """The checkpoint directory cannot be used (not a directory, read-only, full); one line naming it."""


Outcome = Literal["done", "stopped", "already_done", "unsaved"]
# When an attempt plans: ``look`` before the lease (read-only), ``start`` as the lease holder (or without a lease),
# ``fallback`` after a bundle failed to restore, ``restore`` after an in-job restore tore the job down.
Moment = Literal["look", "start", "fallback", "restore"]


@dataclass(frozen=True)
class AttemptStarted:
    """This attempt's identity and how it starts, reported once both the lease and the resume plan are known."""

    run_id: str
    lease: Lease | None  # None with checkpoint.enabled=false, and for a run refused (or done) before taking it
    plan: ResumePlan


@dataclass(frozen=True)
class RunResult:
    """How the run ended: ``done`` (max_steps reached, its bundle published), ``stopped`` (on request, the current
    step's bundle published — or nothing trained yet), ``already_done`` (the newest bundle already reached
    max_steps: nothing trained), ``unsaved`` (steps were trained that no bundle covers: saves failed)."""

    plan: ResumePlan
    summary: RunSummary
    seconds: float
    outcome: Outcome


def _nothing(*_: object) -> None:
    return None


@dataclass(frozen=True)
class JobCallbacks:
    """How ``run_job`` reports to its caller (``sc-app run`` prints and logs): the plan each time it is decided,
    every progress record in order, Ray being up (signal handlers to reinstall), and the attempt once it starts;
    ``stop_requested`` is polled (a signal arrived)."""

    on_plan: Callable[[ResumePlan], None] = _nothing
    on_progress: Callable[[ProgressRecord], None] = _nothing
    stop_requested: Callable[[], bool] = lambda: False
    on_ray_ready: Callable[[], None] = _nothing
    on_attempt: Callable[[AttemptStarted], None] = _nothing


@dataclass
class Attempt:
    """What this attempt holds: its id, the rules its bundles are judged by (the directory's lineage once the
    lease holder knows it), the task's dataset record as checked before the run (recorded in every bundle), and
    the lease once taken."""

    cfg: AppConfig
    run_id: str
    rules: BundleRules
    dataset: DatasetRecord | None
    started: float
    calls: JobCallbacks
    lease: Lease | None = None
    keeper: LeaseKeeper | None = None  # renews ``lease``; an in-job restore moves it one epoch on through it
    remote: RemoteTier | None = None  # checkpoint.remote: the bucket (``remote_tier``)

    def plan(self, moment: Moment, *, unrestorable: Mapping[str, str] | None = None) -> ResumePlan:
        """The one place this attempt decides which bundle it resumes (``choose_bundle`` with its rules).

        Invariants: a plan tidies (moves leftovers and bad bundles aside) only once the attempt holds the lease; a
        ``start`` plan is announced (``on_plan`` and ``on_attempt``), a ``fallback`` or ``restore`` plan reported
        (``on_plan``), a ``look`` only when it refuses (the caller announces the one it acts on); a refused plan
        raises ``ResumeRefused`` after it was reported, and so does a ``fallback`` that finds no bundle to resume
        (``unrestorable``: bundle name → why it verified but could not be restored). With bundles committed on the
        bucket alone (``checkpoint.remote.parts=direct``), an in-job restore brings the bucket's newest home
        first."""
        if moment == "restore" and self.remote is not None and self.remote.link() is not None:
            self.remote.bring_newest_home(self.rules, self.lease)
        plan = choose_bundle(self.rules, tidy=self.lease is not None, unrestorable=unrestorable)
        refused = plan.decision == "refuse" or (moment == "fallback" and plan.decision != "resume")
        if moment == "start" or (moment == "look" and refused):
            self.announce(plan)
        elif moment != "look":
            self.calls.on_plan(plan)
        if refused:
            raise ResumeRefused(plan.reason)
        return plan

    def announce(self, plan: ResumePlan) -> None:
        self.calls.on_plan(plan)
        self.calls.on_attempt(AttemptStarted(self.run_id, self.lease, plan))

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def nothing_trained(self, plan: ResumePlan, outcome: Outcome) -> RunResult:
        return RunResult(plan, RunSummary(plan.step, 0, last_saved_step=plan.step), self.seconds(), outcome)


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """``ray.init`` installs a SIGTERM handler that exits the driver at once (exit 15), so a preemption notice that
    arrives while Ray starts would bypass sc-app's graceful stop. Keep the caller's handler while Ray starts."""
    utils = ray._private.utils
    original = getattr(utils, "set_sigterm_handler", None)
    if original is None:  # another Ray layout: the SystemExit fallback in _train still maps it to a stop
        yield
        return
    utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        utils.set_sigterm_handler = original


def init_ray(cfg: AppConfig, stop_requested: Callable[[], bool] = lambda: False) -> bool:
    """Start (embedded) or join (cluster) Ray; returns True when this process started it."""
    with keep_sigterm_handler():
        return _init_ray(cfg, stop_requested)


def _init_ray(cfg: AppConfig, stop_requested: Callable[[], bool]) -> bool:
    """One line (``ray_start.RayStartFailed``) instead of Ray's traceback when Ray cannot start; a start-up that
    timed out is retried once (``ray_start.start_ray``)."""
    logging.getLogger("transfer_queue").setLevel(logging.ERROR)
    logging.getLogger("ray").propagate = True  # with configure_logging=False: to libraries.log, not the console
    verbose = cfg.run.log_level == "DEBUG"
    if cfg.ray.address is None:
        ray_start.check_ray_tmpdir()  # before Ray writes anything there
        ray_start.start_ray(
            lambda: ray.init(
                address="local",
                num_cpus=cfg.ray.num_cpus,
                include_dashboard=False,
                namespace=cfg.ray.namespace,
                log_to_driver=verbose,
                logging_level=logging.WARNING,
                configure_logging=False,
                runtime_env=ray_start.job_runtime_env({}),
                _system_config=ray_start.EMBEDDED_SYSTEM_CONFIG,
                _metrics_export_port=cfg.ray.metrics_export_port,
            ),
            ray.shutdown,
            what="its embedded node",
            stop_requested=stop_requested,
        )
        return True
    # Actors on a running cluster do not inherit this process's environment: carry sc-app's own variables
    # (HMAC key, fault injection) to them.
    env_vars = {k: v for k, v in os.environ.items() if k.startswith("SC_APP_")}
    ray_start.start_ray(
        lambda: ray.init(
            address=cfg.ray.address,
            namespace=cfg.ray.namespace,
            log_to_driver=verbose,
            logging_level=logging.WARNING,
            configure_logging=False,
            runtime_env=ray_start.job_runtime_env(env_vars),
        ),
        ray.shutdown,
        what=f"a connection to the cluster at ray.address={cfg.ray.address}",
        stop_requested=stop_requested,
    )
    return False


def start_controller(attempt: Attempt, plan: ResumePlan) -> tuple[Setup, ResumePlan]:
    """``setup_single_controller`` for ``plan``; a bundle that verified but cannot be restored is handled like one
    that failed verification: with ``on_corrupt=fallback`` it is moved aside (only when an older bundle verifies)
    and the next one is tried, in this process; otherwise the run is refused and nothing is moved."""
    from sc_app.attempt.setup import setup_single_controller  # heavy: imported only once Ray is up

    unrestorable: dict[str, str] = {}
    while True:
        try:
            setup = setup_single_controller(
                attempt.cfg,
                plan,
                run_id=attempt.run_id,
                lease=attempt.lease,
                lineage=attempt.rules.lineage,
                dataset=attempt.dataset,
                remote=attempt.remote.link() if attempt.remote is not None else None,
            )
            return setup, plan
        except RestoreFailed as exc:
            log.warning("%s", exc)
            unrestorable[exc.bundle.name] = str(exc)
        plan = attempt.plan("fallback", unrestorable=unrestorable)


def run_job(cfg: AppConfig, calls: JobCallbacks | None = None) -> RunResult:
    """Plan the resume, take the writer lease, tidy, start Ray + TransferQueue, run to ``run.max_steps``, shut down.

    Everything that can refuse the run (bad model/data/reward input, an unusable directory, bundles that must not
    be resumed, a malformed LEASE, nothing left to train) is decided read-only *before* the lease is taken, so a
    refused run never supersedes a live one. From the lease on, an older attempt still writing this directory can
    no longer publish. ``calls.stop_requested`` (a signal) and a ``sc-app stop`` request addressed to this run's
    lease both stop the run gracefully; the lease is released at the end with how the run ended."""
    started = time.perf_counter()
    calls = calls or JobCallbacks()
    dataset = hooks.check_inputs(cfg)  # bad model, data or reward: one line, before anything is taken or started
    root = Path(cfg.checkpoint.dir)
    problem = volume.unwritable(root) if cfg.checkpoint.enabled else volume.unusable_as_dir(root)
    problem = problem or volume.not_appendable(cfg.run.trace_file, "run.trace_file")
    if problem:
        raise CheckpointDirUnusable(problem)
    read_lease(root)  # a malformed LEASE is refused here (LeaseError), before anything else happens
    remote = open_remote(cfg, root)  # the bucket's checks (RemoteRefused), before anything is taken or started
    rules = BundleRules.for_run(cfg, dataset=lambda: dataset)
    if remote is not None:
        remote.bring_home(rules)  # the bucket's newest bundle, when nothing local is as new
        calls = remote.watch(calls)  # published bundles go to the uploader; its uploads are reported
    attempt = Attempt(cfg, uuid.uuid4().hex[:12], rules, dataset, started, calls, remote=remote)
    plan = attempt.plan("look")  # before the lease: moves nothing; a refusal is announced and raised
    if plan.decision == "resume" and plan.step >= cfg.run.max_steps:
        attempt.announce(plan)
        return attempt.nothing_trained(plan, "already_done")
    if calls.stop_requested():
        attempt.announce(plan)
        return attempt.nothing_trained(plan, "stopped")
    if not cfg.checkpoint.enabled:
        attempt.announce(plan)
        return _train(attempt, plan, calls.stop_requested)
    return _run_as_lease_holder(attempt, plan)


def _run_as_lease_holder(attempt: Attempt, plan: ResumePlan) -> RunResult:
    """Take the lease, decide again as its holder (now leftovers may be moved aside), train, release the lease
    with how the run ended (unless a newer run took it)."""
    cfg, root = attempt.cfg, attempt.rules.root
    try:
        lease = attempt.lease = Lease.acquire(root, attempt.run_id, ttl_s=cfg.checkpoint.lease_ttl_s)
    except OSError as exc:
        raise CheckpointDirUnusable(f"checkpoint dir {root}: cannot take its lease ({exc.strerror or exc})") from None
    keeper = attempt.keeper = LeaseKeeper(lease, cfg.checkpoint.lease_ttl_s)
    outcome, final_step = "failed", None
    try:
        adopt = _recorded_lineage(plan) or (attempt.remote.lineage() if attempt.remote else None)
        attempt.rules = attempt.rules.with_lineage(ensure_lineage(root, adopt=adopt))
        # take the bucket; what the attempt it fences published since the first look comes home before the decision
        if attempt.remote is not None and attempt.remote.take(attempt.run_id, attempt.rules.lineage or ""):
            attempt.remote.bring_home(attempt.rules)
        try:
            plan = attempt.plan("start")  # as the holder: now it may move leftovers aside
        except ResumeRefused:
            outcome = "refused"
            raise
        if attempt.remote is not None:  # take the bucket; catch it up with the bundle resumed from
            attempt.remote.start(attempt.run_id, attempt.rules.lineage or "", plan.bundle if plan.step else None)
        watch = StopWatch(root, attempt.run_id, lease.fencing_epoch)
        result = _train(attempt, plan, lambda: attempt.calls.stop_requested() or watch.requested() is not None)
        outcome, final_step = result.outcome, result.summary.final_step
        return result
    except LeaseLost:
        outcome = "superseded"
        raise
    finally:
        keeper.stop()
        if attempt.remote is not None:
            attempt.remote.finish(wait=outcome == "done")
        if outcome != "superseded":
            newest = layout.step_dirs(root)
            current = attempt.lease or lease  # an in-job restore moved the epoch on
            current.release(outcome, final_step=final_step, newest_bundle=newest[0][1].name if newest else None)


def _recorded_lineage(plan: ResumePlan) -> str | None:
    """The lineage the last bundle the plan checked records: what a directory without LINEAGE adopts."""
    manifest = plan.reports[-1].manifest if plan.reports else None
    adopt = manifest.doc.get("lineage") if manifest is not None else None
    return adopt if isinstance(adopt, str) else None


def _train(attempt: Attempt, plan: ResumePlan, stop_requested: Callable[[], bool]) -> RunResult:
    """Ray up, the controller set up (falling back past bundles that cannot be restored), driven to its end."""
    cfg = attempt.cfg
    try:
        owns_ray = init_ray(cfg, stop_requested)
    except BaseException as exc:  # ray.init's SIGTERM handler before ours is back; a stop during a retry
        if not isinstance(exc, StopCut) and (not isinstance(exc, SystemExit) or exc.code != signal.SIGTERM):
            raise
        return attempt.nothing_trained(plan, "stopped")  # ray.init's own SIGTERM handler: a stop like any other
    attempt.calls.on_ray_ready()  # e.g. (re)install signal handlers: ray.init replaces SIGTERM's
    from sc_app.attempt.cluster_job import ClusterJob  # torch and the workers' code: only once Ray is up

    job = ClusterJob(attempt, stop_requested, start_controller)
    try:
        warm = cfg.run.in_job_restore == "warm"
        summary, plan = drive_restoring(job, plan, cfg.run.max_in_job_restores, warm=warm)
        return RunResult(plan, summary, attempt.seconds(), _outcome(cfg, summary))
    except StopCut as exc:  # a stop during a set-up: it was torn down; the plan's bundle stays the resume point
        log.warning("%s; the set-up was torn down", exc)
        return attempt.nothing_trained(job.plan or plan, "stopped")
    finally:
        from sc_app.data_plane.transferqueue import shutdown_transferqueue

        job.spares.close()
        shutdown_transferqueue()
        if owns_ray:
            ray.shutdown()


def _outcome(cfg: AppConfig, summary: RunSummary) -> Outcome:
    if summary.stopped_early and summary.emergency_skipped:  # on purpose: the bundle could not have finished
        return "stopped"
    if cfg.checkpoint.enabled and summary.unsaved_steps > 0:
        return "unsaved"
    return "stopped" if summary.stopped_early else "done"
