"""The driver: ``setup_single_controller()`` builds every object, restores, then starts the controller.

Restore order (seed), asserted by ``SetupOrder`` here and by the shared ``DataPlaneGuard`` across processes:
  1. read step_N: trainer state and loader place
  2. bootstrap client ``load_checkpoint()`` on an untouched TransferQueue
  3. seal the restore decision (only now may connect-only clients exist)
  4. ``SingleControllerActor.remote(args + restored metadata)``
Step 1 is *issued* first and finishes before step 3; the trainer workers start and read their state while this
process restores the data plane (they touch no data plane until after the seal), so a resume costs
max(trainer start + load, data-plane restore) rather than their sum.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch

from sc_app.checkpoint import ResumePlan, hmac_key_from_env, layout, plan_resume
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.lease import Lease
from sc_app.config import CONTROLLER_ACTOR_CPUS, AppConfig
from sc_app.controller import SingleControllerActor, SingleControllerActorArgs
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, shutdown_transferqueue
from sc_app.policy.generation import GenerationWorker
from sc_app.policy.trainer import TrainerWorker

log = logging.getLogger(__name__)


class ResumeRefused(RuntimeError):
    """The checkpoint directory holds bundles that must not be resumed (or skipped) silently."""


class JobFailed(RuntimeError):
    """A process of the job died (controller actor, worker); a rerun resumes from the newest complete bundle."""


class EmergencyTimeout(RuntimeError):
    """SIGTERM's emergency checkpoint did not finish inside ``checkpoint.emergency_budget_s``."""


def _unwrap(exc: BaseException) -> BaseException:
    """The original exception behind a Ray task error (``LeaseLost``, ``SaveFailed``, ...)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class SetupOrder:
    """Asserts the restore phases happen in the seed's order, each once."""

    PHASES = ("bootstrap_client", "trainer_state", "data_plane_restore", "sealed", "actor")

    def __init__(self) -> None:
        self.done: list[str] = []

    def enter(self, phase: str) -> None:
        """Pre: ``phase`` comes after the last one entered, skipping only the optional restore phases."""
        at = len(self.done) and self.PHASES.index(self.done[-1]) + 1
        skippable = {"trainer_state", "data_plane_restore"}
        while at < len(self.PHASES) and self.PHASES[at] != phase and self.PHASES[at] in skippable:
            at += 1
        if at >= len(self.PHASES) or self.PHASES[at] != phase:
            raise AssertionError(f"setup phase '{phase}' out of order after {self.done}")
        self.done.append(phase)


class TQPolicy:
    """Owns the trainer workers, the generation workers and the bootstrap data-plane client."""

    def __init__(self, cfg: AppConfig, dp_client: TransferQueueDataPlane) -> None:
        self.cfg = cfg
        self.dp_client = dp_client
        cfg_json = cfg.model_dump_json()
        t, g = cfg.trainer, cfg.generation
        self.trainers = [
            TrainerWorker.options(num_cpus=t.num_cpus, num_gpus=t.num_gpus, resources=t.resources or None).remote(
                cfg_json, rank, t.num_workers
            )
            for rank in range(t.num_workers)
        ]
        self.generators = [
            GenerationWorker.options(num_cpus=g.num_cpus, num_gpus=g.num_gpus, resources=g.resources or None).remote(
                cfg_json, i
            )
            for i in range(g.num_workers)
        ]
        if t.num_workers > 1:
            addr, port = ray.get(self.trainers[0].address.remote())
            backends = ray.get([w.init_process_group.remote(addr, port) for w in self.trainers])
            log.info("trainer workers joined torch.distributed (%s, world size %d)", backends[0], t.num_workers)

    def load_trainer_state(self, policy_dir: Path) -> list[Any]:
        """Start every trainer loading ``policy_dir``; ``trainer_state_loaded`` waits for them."""
        return [w.load.remote(str(policy_dir)) for w in self.trainers]

    def trainer_state_loaded(self, loading: list[Any], policy_dir: Path) -> int:
        """The restored trainer version; ``ResumeRefused`` if the bundle's policy does not fit this model."""
        try:
            versions = ray.get(loading)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if exc.cause is not None else exc
            raise ResumeRefused(
                f"{policy_dir}: does not load into the configured model "
                f"({type(cause).__name__}: {str(cause).splitlines()[0]}); it was written for another model shape "
                "or sc-app version — point checkpoint.dir elsewhere or restore the matching config"
            ) from None
        return int(versions[0])

    def load_data_plane_checkpoint(self, data_plane_dir: Path) -> dict[str, Any]:
        """Seed flow 1: restore TransferQueue through the bootstrap client, before anything touched it."""
        return self.dp_client.load_checkpoint(data_plane_dir)

    def sync_generation_weights(self, version: int) -> None:
        weights = self.trainers[0].get_weights.remote()
        ray.get([w.set_weights.remote(weights, version) for w in self.generators])


@dataclass
class Setup:
    actor: Any
    policy: TQPolicy
    args: SingleControllerActorArgs
    order: SetupOrder


def setup_single_controller(cfg: AppConfig, plan: ResumePlan, *, run_id: str, lease: Lease | None = None) -> Setup:
    order = SetupOrder()
    dp_client = TransferQueueDataPlane(
        bootstrap=True,
        namespace=cfg.ray.namespace,
        storage_units=cfg.data_plane.storage_units,
        storage_node_resource=cfg.data_plane.storage_node_resource,
        snapshot=cfg.data_plane.snapshot,
    )
    order.enter("bootstrap_client")
    policy = TQPolicy(cfg, dp_client)
    start_step = start_version = 0
    loader_state = sidecar = restored = None
    if plan.decision == "resume":
        assert plan.bundle is not None
        bundle = plan.bundle
        order.enter("trainer_state")
        loading = policy.load_trainer_state(bundle / layout.POLICY_DIR)  # runs on the trainers from here on
        loader_state = torch.load(bundle / layout.LOADER_FILE, map_location="cpu", weights_only=True)
        order.enter("data_plane_restore")
        restored = policy.load_data_plane_checkpoint(bundle / layout.DATA_PLANE_DIR)
        manifest = plan.reports[-1].manifest
        assert manifest is not None
        if restored.get("digest") != manifest.replay_digest:
            raise ResumeRefused(f"{bundle}: data-plane digest differs from the manifest's replay digest")
        start_version = policy.trainer_state_loaded(loading, bundle / layout.POLICY_DIR)
        start_step = plan.step
        sidecar = str(bundle / layout.SIDECAR_FILE)
    dp_client.seal({"decision": plan.decision, "step": start_step, "run_id": run_id})
    order.enter("sealed")
    policy.sync_generation_weights(start_version)
    args = SingleControllerActorArgs(
        cfg_json=cfg.model_dump_json(),
        run_id=run_id,
        trainers=policy.trainers,
        generators=policy.generators,
        start_step=start_step,
        start_version=start_version,
        loader_state=loader_state,
        sidecar_path=sidecar,
        data_plane_checkpoint_metadata=restored,
        resumed_from=plan.bundle.name if plan.bundle else None,
        lease=lease,
    )
    actor = SingleControllerActor.options(num_cpus=CONTROLLER_ACTOR_CPUS).remote(args)
    order.enter("actor")
    return Setup(actor=actor, policy=policy, args=args, order=order)


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


@dataclass
class RunResult:
    plan: ResumePlan
    summary: dict[str, Any]
    seconds: float


def run_job(
    cfg: AppConfig,
    *,
    on_plan: Callable[[ResumePlan], None] = lambda p: None,
    on_progress: Callable[[dict[str, Any]], None] = lambda r: None,
    stop_requested: Callable[[], bool] = lambda: False,
    on_ray_ready: Callable[[], None] = lambda: None,
) -> RunResult:
    """Take the writer lease, plan the resume, start Ray + TransferQueue, run to ``run.max_steps``, shut down.

    The lease comes first: from then on an older attempt still writing this directory can no longer publish.
    """
    started = time.perf_counter()
    run_id = uuid.uuid4().hex[:12]
    lease = Lease.acquire(cfg.checkpoint.dir, run_id) if cfg.checkpoint.enabled else None
    plan = plan_resume(
        cfg.checkpoint.dir,
        policy=cfg.checkpoint.on_corrupt,
        hmac_key=hmac_key_from_env(),
        expected_compat=compat_of(cfg),
        tidy=True,
    )
    on_plan(plan)
    if plan.decision == "refuse":
        raise ResumeRefused(plan.reason)
    if plan.decision == "resume" and plan.step >= cfg.run.max_steps:
        return RunResult(plan, {"final_step": plan.step, "already_done": True}, time.perf_counter() - started)
    owns_ray = init_ray(cfg)
    on_ray_ready()  # e.g. (re)install signal handlers: ray.init replaces SIGTERM's
    try:
        setup = setup_single_controller(cfg, plan, run_id=run_id, lease=lease)
        ref = setup.actor.run.remote()
        seen = 0
        deadline: float | None = None
        try:
            while True:
                ready, _ = ray.wait([ref], timeout=0.5)
                for record in ray.get(setup.actor.progress.remote(seen)):
                    seen += 1
                    on_progress(record)
                if ready:
                    break
                if deadline is None and stop_requested():
                    setup.actor.request_stop.remote()
                    deadline = time.monotonic() + cfg.checkpoint.emergency_budget_s
                if deadline is not None and time.monotonic() > deadline:
                    ray.kill(setup.actor)  # nothing half-written is renamed: the rename is the last, atomic step
                    raise EmergencyTimeout(
                        f"emergency checkpoint did not finish within checkpoint.emergency_budget_s="
                        f"{cfg.checkpoint.emergency_budget_s:g}s; the newest older bundle stays the resume point"
                    )
            summary = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise JobFailed(
                f"the controller actor died ({type(exc).__name__}); rerun to resume from the newest complete bundle"
            ) from None
        except ray.exceptions.RayTaskError as exc:
            cause = _unwrap(exc)
            if isinstance(cause, ray.exceptions.RayActorError):
                raise JobFailed(
                    f"a worker died ({type(cause).__name__}); rerun to resume from the newest complete bundle"
                ) from None
            raise cause from None
        return RunResult(plan, summary, time.perf_counter() - started)
    finally:
        shutdown_transferqueue()
        if owns_ray:
            ray.shutdown()
