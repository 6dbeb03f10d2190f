"""One attempt of the training job: lease → resume plan → Ray → setup → drive the controller → shut down.

``run_job`` is what ``sc-app run`` calls; each of its steps is one function here. Errors leave it typed:
``ResumeRefused`` (bad bundles: exit 2), ``LeaseLost`` (superseded: exit 3), ``JobFailed`` / ``EmergencyTimeout``
/ ``SaveFailed`` / ``InventoryMismatch`` (exit 1) — the CLI maps them to exit codes.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import ray

from sc_app.checkpoint import ResumePlan, hmac_key_from_env, plan_resume
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.lease import Lease
from sc_app.config import AppConfig
from sc_app.data_plane.transferqueue import shutdown_transferqueue
from sc_app.driver import ResumeRefused, setup_single_controller
from sc_app.policy.hf.dataset import DatasetRecord, changed_dataset_problem
from sc_app.progress import ProgressRecord, RunSummary

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # how often the driver collects progress and checks for a stop request


class JobFailed(RuntimeError):
    """A process of the job died (controller actor, worker); a rerun resumes from the newest complete bundle."""


class EmergencyTimeout(RuntimeError):
    """The stop request's emergency checkpoint did not finish inside ``checkpoint.emergency_budget_s``."""


@dataclass(frozen=True)
class RunResult:
    plan: ResumePlan
    summary: RunSummary  # final_step == the resumed step and nothing trained when ``already_done``
    seconds: float
    already_done: bool = False


def init_ray(cfg: AppConfig) -> bool:
    """Start (embedded) or join (cluster) Ray; returns True when this process started it."""
    logging.getLogger("transfer_queue").setLevel(logging.ERROR)
    verbose = cfg.run.log_level == "DEBUG"
    if cfg.ray.address is None:
        ray.init(
            address="local",
            num_cpus=cfg.ray.num_cpus,
            include_dashboard=False,
            namespace=cfg.ray.namespace,
            log_to_driver=verbose,
            logging_level=logging.WARNING,
        )
        return True
    # Actors on a running cluster do not inherit this process's environment: carry sc-app's own variables
    # (HMAC key, fault injection) to them.
    env_vars = {k: v for k, v in os.environ.items() if k.startswith("SC_APP_")}
    ray.init(
        address=cfg.ray.address,
        namespace=cfg.ray.namespace,
        log_to_driver=verbose,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": env_vars} if env_vars else None,
    )
    return False


def plan_for(cfg: AppConfig) -> ResumePlan:
    """The resume decision for ``cfg``'s checkpoint dir (the same one ``sc-app preflight`` prints)."""
    return plan_resume(
        cfg.checkpoint.dir,
        policy=cfg.checkpoint.on_corrupt,
        hmac_key=hmac_key_from_env(),
        expected_compat=compat_of(cfg),
        tidy=True,
    )


def check_backend_inputs(cfg: AppConfig) -> DatasetRecord | None:
    """hf backend: the model directory, dataset, reward and prompt lengths (``HFInputError``, one line); returns
    the dataset record bundles carry. Nothing to check for the tiny backend."""
    if cfg.model.backend != "hf":
        return None
    from sc_app.policy.hf.inputs import check_inputs

    return check_inputs(cfg).dataset


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
) -> RunSummary:
    """Run the controller to its end, handing every progress record to ``on_progress`` in order. Once
    ``stop_requested()`` is true the controller is asked to stop (finish the step, cut a bundle of it) and given
    ``emergency_budget_s``; past that it is killed — nothing half-written is renamed, so the newest older bundle
    stays the resume point — and ``EmergencyTimeout`` is raised."""
    ref = actor.run.remote()  # type: ignore[attr-defined]
    seen = 0
    deadline: float | None = None
    with job_errors():
        while True:
            ready, _ = ray.wait([ref], timeout=poll_seconds)
            for record in ray.get(actor.progress.remote(seen)):  # type: ignore[attr-defined]
                seen += 1
                on_progress(record)
            if ready:
                return ray.get(ref)
            if deadline is None and stop_requested():
                actor.request_stop.remote()  # type: ignore[attr-defined]
                deadline = time.monotonic() + emergency_budget_s
            if deadline is not None and time.monotonic() > deadline:
                ray.kill(actor)
                raise EmergencyTimeout(
                    f"emergency checkpoint did not finish within checkpoint.emergency_budget_s="
                    f"{emergency_budget_s:g}s; the newest older bundle stays the resume point"
                )


def run_job(
    cfg: AppConfig,
    *,
    on_plan: Callable[[ResumePlan], None] = lambda p: None,
    on_progress: Callable[[ProgressRecord], None] = lambda r: None,
    stop_requested: Callable[[], bool] = lambda: False,
    on_ray_ready: Callable[[], None] = lambda: None,
) -> RunResult:
    """Take the writer lease, plan the resume, start Ray + TransferQueue, run to ``run.max_steps``, shut down.

    The lease comes first: from then on an older attempt still writing this directory can no longer publish.
    """
    started = time.perf_counter()
    dataset = check_backend_inputs(cfg)  # bad model, data or reward: one line, before anything is taken or started
    run_id = uuid.uuid4().hex[:12]
    lease = Lease.acquire(cfg.checkpoint.dir, run_id) if cfg.checkpoint.enabled else None
    plan = plan_for(cfg)
    on_plan(plan)
    if plan.decision == "refuse":
        raise ResumeRefused(plan.reason)
    if plan.decision == "resume" and dataset is not None and not cfg.task.allow_changed_dataset:
        recorded = plan.manifest.dataset if plan.manifest is not None else None
        problem = changed_dataset_problem(recorded, dataset, bundle=str(plan.bundle))
        if problem:
            raise ResumeRefused(problem)
    if plan.decision == "resume" and plan.step >= cfg.run.max_steps:
        done = RunSummary(final_step=plan.step, version=0)
        return RunResult(plan, done, time.perf_counter() - started, already_done=True)
    owns_ray = init_ray(cfg)
    on_ray_ready()  # e.g. (re)install signal handlers: ray.init replaces SIGTERM's
    try:
        setup = setup_single_controller(cfg, plan, run_id=run_id, lease=lease, dataset=dataset)
        summary = drive(
            setup.actor,
            emergency_budget_s=cfg.checkpoint.emergency_budget_s,
            on_progress=on_progress,
            stop_requested=stop_requested,
        )
        return RunResult(plan, summary, time.perf_counter() - started)
    finally:
        shutdown_transferqueue()
        if owns_ray:
            ray.shutdown()
