"""The driver: ``setup_single_controller()`` builds every object, restores, then starts the controller.

Restore order (seed), asserted by ``SetupOrder`` here and by the shared ``DataPlaneGuard`` across processes:
  1. read step_N: trainer state and loader place
  2. bootstrap client ``load_checkpoint()`` on an untouched TransferQueue
  3. seal the restore decision (only now may connect-only clients exist)
  4. ``SingleControllerActor.remote(args + restored metadata)``
  5. ``actor.restore()``: ``load_state_dict(sidecar)`` (index only) and the inventory check, before any pump
Step 1 is *issued* first and finishes before step 3; the trainer workers start and read their state while this
process restores the data plane (they touch no data plane until after the seal), so a resume costs max(trainer
start + load, data-plane restore), not their sum; the workers are created before TransferQueue is started, so a
start costs max(worker start, TransferQueue start).

A bundle that verified but fails any restore step raises ``RestoreFailed`` after everything this setup built is
torn down (actors killed, TransferQueue closed, the guard gone), so the caller can fall back to an older bundle
in the same process, exactly as a failed verification does.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from sc_app.attempt.actor_watch import TRAINER, is_actor_death
from sc_app.attempt.data_plane_start import bootstrap_data_plane
from sc_app.attempt.errors import RestoreFailed
from sc_app.attempt.errors import ResumeRefused as ResumeRefused  # re-exported: where callers knew it
from sc_app.attempt.node_copies import Get, NodeCopies
from sc_app.checkpoint import ResumePlan, layout
from sc_app.checkpoint.dataset import DatasetRecord
from sc_app.checkpoint.lease import CheckpointDirNotShared, Lease
from sc_app.checkpoint.node_parts import NodeCopyFailed
from sc_app.checkpoint.remote.parts import RemoteLink
from sc_app.config.app import AppConfig
from sc_app.config.embedded import CONTROLLER_ACTOR_CPUS
from sc_app.controller.actor import SingleControllerActor, SingleControllerActorArgs
from sc_app.data_plane.guard import GUARD_NAME
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, shutdown_transferqueue
from sc_app.io import torch_files
from sc_app.progress import JobFailed
from sc_app.rl.backend import PolicyFingerprint
from sc_app.rl.generation import GenerationWorker
from sc_app.rl.hooks import InputError
from sc_app.rl.trainer import TrainerWorker
from sc_app.rl.weight_sync.push import WeightSync
from sc_app.waits import StopCut, get, stop_before

log = logging.getLogger(__name__)


def _one_line(exc: BaseException) -> str:
    inner = cause if isinstance(cause := getattr(exc, "cause", None), BaseException) else exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0] if text else ''}".rstrip(": ")


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


def start_controller_actor(args: SingleControllerActorArgs) -> Any:
    """The controller actor, on the driver's node while it has room (soft affinity): the node of the run's lease
    and, with a checkpoint directory per pod (the chart's ``checkpoint.volume: local``), of the bundles it commits."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    near = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    actor = ray.remote(SingleControllerActor).options(num_cpus=CONTROLLER_ACTOR_CPUS, scheduling_strategy=near)
    return actor.remote(args)


# Errors of a worker that are no fault of a bundle (bad input, a node that does not see the checkpoint directory):
# raised as themselves out of the worker's task error, never read as "this bundle does not restore".
NOT_THE_BUNDLES = (InputError, CheckpointDirNotShared, NodeCopyFailed)


def own_error(exc: BaseException) -> BaseException:
    """``exc``'s cause when ``exc`` is a task error carrying one of ``NOT_THE_BUNDLES``, else ``exc``."""
    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, NOT_THE_BUNDLES):
        return exc.cause
    return exc


def worker_results(refs: list[Any]) -> list[Any]:
    """``ray.get(refs)`` bounded by the set-up's deadline and stop request (``sc_app.waits``); a worker's bad input
    (model directory, dataset, reward) or unseen checkpoint directory is raised as itself."""
    try:
        return list(get(refs, what="the trainer or generation workers", kind=TRAINER))
    except ray.exceptions.RayTaskError as exc:
        if own_error(exc) is not exc:
            raise own_error(exc) from None
        raise


class TQPolicy:
    """Owns the trainer workers, the generation workers and the bootstrap data-plane client.

    The workers are created and their ``setup`` (process group, backend) issued here, none of it awaited: calls
    issued after it run after it on each worker, and ``trainer_state_loaded`` / ``sync_generation_weights`` surface
    its errors. So their processes start (imports, model build) while the caller goes on: ``_build`` creates this
    before TransferQueue, and the bootstrap client (``dp_client``) is handed over once it exists."""

    def __init__(
        self,
        cfg: AppConfig,
        dp_client: TransferQueueDataPlane | None = None,
        *,
        dataset: DatasetRecord | None = None,
        lease: Lease | None = None,
    ) -> None:
        """``lease``: the run's; every trainer rank checks first that it sees its checkpoint directory."""
        self.cfg = cfg
        self.dp_client = dp_client
        self.lease = lease
        cfg_json = cfg.model_dump_json()
        tcfg, gcfg = cfg.trainer, cfg.generation
        self.trainers = [
            TrainerWorker.options(
                num_cpus=tcfg.num_cpus, num_gpus=tcfg.num_gpus, resources=tcfg.resources or None
            ).remote(cfg_json, rank, tcfg.num_workers)
            for rank in range(tcfg.num_workers)
        ]
        self.generators = [
            GenerationWorker.options(
                num_cpus=gcfg.num_cpus, num_gpus=gcfg.num_gpus, resources=gcfg.resources or None
            ).remote(cfg_json, i)
            for i in range(gcfg.num_workers)
        ]
        self.weights = WeightSync(self.trainers)
        # rank 0's rendezvous address as two refs (not awaited): every rank's setup runs once rank 0 has answered
        addr, port = self.trainers[0].address.options(num_returns=2).remote() if tcfg.num_workers > 1 else ("", 0)
        self.copies = NodeCopies()  # every rank checks first that it sees the checkpoint directory
        if lease is not None:
            self.copies.ask(self.trainers, lease)
        self._setup = [w.setup.remote(addr, port) for w in self.trainers]
        self._generators_setup = [w.setup.remote(dataset.sha256 if dataset else None) for w in self.generators]

    def trainers_ready(self) -> None:
        """Wait for every trainer's setup; its errors are raised here (a rank's unseen checkpoint directory first)."""
        self.copies.answers(worker_results)
        if self._setup:
            used = worker_results(self._setup)
            if len(used) > 1:
                log.info("trainer workers joined torch.distributed (%s, world size %d)", used[0], len(used))
            self._setup = []

    def generators_ready(self) -> None:
        """Wait for every generation worker's setup; its errors are raised here."""
        if self._generators_setup:
            worker_results(self._generators_setup)
            self._generators_setup = []

    def load_trainer_state(self, policy_dir: Path, expected: dict[str, str], get: Get = worker_results) -> list[Any]:
        """Start every trainer loading ``policy_dir`` (``expected``: its files' digests from the verified manifest);
        ``trainer_state_loaded`` waits for them. With ``checkpoint.volume=local`` each node that does not see the
        directory is sent its ``policy/`` first, through the node's lowest rank, which checks the copy before any
        rank there loads it (``node_copies``); ``trainer_state_loaded`` frees those disks once the loads are over.
        ``get``: how those calls are awaited (a warm reset bounds them by its own timeout)."""
        if self.cfg.checkpoint.volume == "local" and self.lease is not None:
            self.copies.send(self.trainers, self.lease, policy_dir, expected, get)
        return [w.load.remote(str(policy_dir), expected) for w in self.trainers]

    def trainer_state_loaded(self, loading: list[Any], policy_dir: Path) -> int:
        """The restored trainer version; ``RestoreFailed`` if the bundle's policy does not load into this model."""
        self.trainers_ready()
        try:
            versions = get(loading, what="the trainer workers loading the bundle", kind=TRAINER)
            self.copies.drop()
        except ray.exceptions.RayTaskError as exc:
            self.copies.drop()
            if own_error(exc) is not exc:
                raise own_error(exc) from None
            raise RestoreFailed(
                policy_dir.parent,
                f"{policy_dir} does not load into the configured model ({_one_line(exc)}); it was written for "
                "another model shape or sc-app version",
            ) from None
        return int(versions[0])

    def load_data_plane_checkpoint(self, data_plane_dir: Path) -> dict[str, Any]:
        """Seed flow 1: restore TransferQueue through the bootstrap client, before anything touched it."""
        assert self.dp_client is not None, "the bootstrap client is handed over before any restore"
        return self.dp_client.load_checkpoint(data_plane_dir)

    def sync_generation_weights(self, version: int) -> None:
        """One object (rank 0's weights) to every generation worker; every trainer takes part (sharded models)."""
        self.trainers_ready()
        self.generators_ready()
        self.weights.push_blocking(self.generators, version, get=worker_results)

    def fingerprint(self, get: Get = worker_results) -> PolicyFingerprint | None:
        """Of the whole trainer state (rank 0's answer; collective where sharded)."""
        return get([t.fingerprint.remote() for t in self.trainers])[0]


@dataclass
class Setup:
    """What ``setup_single_controller`` built; ``teardown()`` removes all of it (for a fallback or a retry)."""

    namespace: str
    actor: Any = None  # the SingleControllerActor handle
    policy: TQPolicy | None = None
    handles: list[Any] = field(default_factory=list)
    # where setup's time went, seconds: "data_plane_restore" (the bootstrap client's load_checkpoint, while the
    # trainers start and load), "trainer_load_wait" (waiting for the trainers after it); both absent on a fresh start
    seconds: dict[str, float] = field(default_factory=dict)
    read_bundle: bool = False  # the restore began reading the bundle: from here a failure may be the bundle's

    def actors(self) -> list[Any]:
        """``handles`` and the workers the policy holds now: a warm reset that failed after it started replacements
        has not listed them in ``handles`` (left alive, they would hold the resources the rebuild's workers wait
        for: a full rebuild that never started)."""
        now = [*self.policy.trainers, *self.policy.generators] if self.policy is not None else []
        return [*self.handles, *(h for h in now if all(h is not k for k in self.handles))]

    def teardown(self) -> None:
        """Kill every actor this setup created, close TransferQueue and drop the restore guard, so that a new
        setup in this process starts from an untouched data plane."""
        for handle in self.actors():
            try:
                ray.kill(handle)
            except Exception:  # already dead: nothing to remove
                log.debug("kill during teardown failed", exc_info=True)
        shutdown_transferqueue()
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(GUARD_NAME, namespace=self.namespace))
        names = [(GUARD_NAME, self.namespace), ("TransferQueueController", "transfer_queue")]
        deadline = time.monotonic() + 30
        while names and time.monotonic() < deadline:  # ray.kill is asynchronous: wait until the names are free
            names = [n for n in names if _named_actor_exists(*n)]
            time.sleep(0.1 if names else 0)


def _named_actor_exists(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return False
    return True


def setup_single_controller(
    cfg: AppConfig,
    plan: ResumePlan,
    *,
    run_id: str,
    lease: Lease | None = None,
    lineage: str | None = None,
    dataset: DatasetRecord | None = None,
    remote: RemoteLink | None = None,
) -> Setup:
    """Build every object on the driver, restore in the seed's order (``SetupOrder``), create the controller and
    let it rebuild and check its index. ``RestoreFailed`` (everything torn down) when a resumed bundle fails; a
    worker's bad input (``InputError``: model directory, dataset, reward) is no fault of the bundle and is raised
    as itself. ``dataset``: the task's dataset file as the driver checked it (recorded in every bundle; every
    generation worker must read the same bytes)."""
    setup = Setup(namespace=cfg.ray.namespace)
    try:
        _build(setup, cfg, plan, run_id=run_id, lease=lease, lineage=lineage, dataset=dataset, remote=remote)
    except BaseException as exc:
        setup.teardown()
        if own_error(exc) is not exc:  # e.g. the controller actor's node does not see the checkpoint directory
            raise own_error(exc) from None
        if isinstance(exc, StopCut | JobFailed):  # a stop request, a hung process: no fault of the bundle
            raise
        if is_actor_death(exc):  # a process died: the job's fault, not the bundle's (an in-job restore's business)
            raise JobFailed(f"a process of the job died while it was being set up ({_one_line(exc)})") from None
        if (
            not setup.read_bundle  # a fresh start, or the workers' or TransferQueue's start: no bundle read yet
            or plan.bundle is None
            or isinstance(exc, (RestoreFailed, KeyboardInterrupt, *NOT_THE_BUNDLES))
        ):
            raise
        raise RestoreFailed(plan.bundle, _one_line(exc)) from None
    return setup


@dataclass
class Restored:
    """What a resume hands the controller (all empty on a fresh start)."""

    step: int = 0
    version: int = 0
    loader_state: Any = None
    sidecar: str | None = None
    data_plane: dict[str, Any] | None = None  # the bootstrap client's load_checkpoint() metadata
    fingerprint: PolicyFingerprint | None = None  # traced runs only


def _restore(setup: Setup, cfg: AppConfig, plan: ResumePlan, order: SetupOrder) -> Restored:
    """Seed steps 1-2 for a resume: the trainers start loading the bundle's policy, the loader place is read, the
    data plane is restored through the bootstrap client while they load; then the trainer version is awaited."""
    assert plan.bundle is not None and setup.policy is not None
    policy, bundle, manifest = setup.policy, plan.bundle, plan.reports[-1].manifest
    assert manifest is not None
    order.enter("trainer_state")
    policy_dir = bundle / layout.POLICY_DIR
    loading = policy.load_trainer_state(policy_dir, manifest.hashes_under(layout.POLICY_DIR))  # runs from here on
    loader_state = torch_files.load(bundle / layout.LOADER_FILE)
    order.enter("data_plane_restore")
    t0 = time.perf_counter()
    restored = policy.load_data_plane_checkpoint(bundle / layout.DATA_PLANE_DIR)
    setup.seconds["data_plane_restore"] = time.perf_counter() - t0
    if restored.get("digest") != manifest.replay_digest:
        raise RestoreFailed(bundle, "the data plane's digest differs from the manifest's replay digest")
    t0 = time.perf_counter()
    version = policy.trainer_state_loaded(loading, policy_dir)
    setup.seconds["trainer_load_wait"] = time.perf_counter() - t0
    # the trace records what was restored (a gather of the whole state: traced runs only)
    fingerprint = policy.fingerprint() if cfg.run.trace_file else None
    return Restored(plan.step, version, loader_state, str(bundle / layout.SIDECAR_FILE), restored, fingerprint)


def controller_args(
    cfg: AppConfig,
    policy: TQPolicy,
    restored: Restored,
    *,
    run_id: str,
    lease: Lease | None,
    lineage: str | None,
    dataset: DatasetRecord | None,
    epoch: int | None = None,
    remote: RemoteLink | None = None,
) -> SingleControllerActorArgs:
    """Seed flow 2: everything the controller actor needs, from what this set-up built and restored."""
    return SingleControllerActorArgs(
        cfg_json=cfg.model_dump_json(),
        run_id=run_id,
        trainers=policy.trainers,
        generators=policy.generators,
        start_step=restored.step,
        start_version=restored.version,
        loader_state=restored.loader_state,
        sidecar_path=restored.sidecar,
        data_plane_checkpoint_metadata=restored.data_plane,
        lease=lease,
        lineage=lineage,
        dataset=dataset.as_manifest() if dataset is not None else None,
        restored_fingerprint=restored.fingerprint,
        epoch=epoch,
        remote=remote,
    )


def _build(
    setup: Setup,
    cfg: AppConfig,
    plan: ResumePlan,
    *,
    run_id: str,
    lease: Lease | None,
    lineage: str | None,
    dataset: DatasetRecord | None,
    remote: RemoteLink | None,
) -> None:
    order = SetupOrder()
    stop_before("the job's processes were started")  # e.g. SIGTERM while Ray was starting
    # The workers first: their processes start (imports, model build) while TransferQueue starts below, so a start
    # costs the slower of the two rather than their sum. They touch no data plane before the seal.
    policy = setup.policy = TQPolicy(cfg, dataset=dataset, lease=lease)
    setup.handles += [*policy.trainers, *policy.generators]
    stop_before("TransferQueue was started")  # its start (seconds) does not look at the stop
    dp_client = policy.dp_client = bootstrap_data_plane(cfg)
    order.enter("bootstrap_client")
    setup.read_bundle = plan.decision == "resume"
    restored = _restore(setup, cfg, plan, order) if plan.decision == "resume" else Restored()
    dp_client.seal({"decision": plan.decision, "step": restored.step, "run_id": run_id})
    order.enter("sealed")
    args = controller_args(cfg, policy, restored, run_id=run_id, lease=lease, lineage=lineage, dataset=dataset,
                           remote=remote)  # fmt: skip
    setup.actor = start_controller_actor(args)
    setup.handles.append(setup.actor)
    order.enter("actor")
    restoring = setup.actor.restore.remote()  # index from the sidecar + inventory check, before any pump
    # the generation workers take the restored weights while the controller's process starts: it calls no worker
    # before its pumps, and they start after set-up
    policy.sync_generation_weights(restored.version)
    get(restoring, what="the controller actor")
