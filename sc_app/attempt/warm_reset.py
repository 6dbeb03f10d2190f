"""Warm in-job restore: restart only what died, reset what lives in place (issue 29; ``docs/recovery.md``).

After a death the job rolls back to the newest verified bundle exactly as a full rebuild would (the lease moved one
epoch on, the dead job's unfinished save quarantined by the re-plan), but the processes that live are kept:

* a hung process (alive, answering nothing) was killed before (``restore_scope``): it is a dead one here, started
  again like one, never waited on;
* the controller actor, when alive, was halted (``SingleControllerActor.halt``) before the re-plan; here it is
  ``reset`` from the bundle's arguments in place (a dead one is started again);
* a dead trainer rank's place goes to a warmed-up spare (``trainer.spare_ranks``, ``sc_app.attempt.spares``: its
  process started and warmed up before the death) or, without one, to a new process; spares not placed on a node yet
  are killed first;
* every live trainer rank is ``reset`` to the new epoch and reads the bundle into its existing model (``load``);
  when a rank died (or there is no bundle: a fresh start) every live rank ``rejoin``\\ s instead — the process group
  is formed again with the replacement and the backend rebuilt on it in the same process — then loads;
* every live generation engine is ``reset`` to the new epoch (a queued call of the old job is refused) and gets
  the bundle's weights through the weight sync (``WeightSync.push_blocking``): no engine start for a fault that is
  not an engine's;
* the data plane (TransferQueue's controller and storage units) is always rebuilt and restored from the bundle:
  TransferQueue cannot survive its controller's death (the controller holds the only index of the units' rows), a
  restore needs an untouched data plane, and a new one is also what fences the old job's puts — the old actors
  are gone with everything a zombie could still write.

The seed's restore order holds (``SetupOrder``): the trainers' policy load is issued, the new data plane is
restored through the bootstrap client while they load, the decision sealed, then the controller restores its
index and checks it against the rows. Every wait is bounded by ``timeout_s``: a live actor that errors or does
not answer in time raises ``ResetFailed`` (the caller falls back to the full rebuild); an actor that dies during
the reset raises ``ActorsDied`` — another death, handled as such.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from sc_app.attempt.actor_watch import (
    CONTROLLER,
    GENERATION,
    TRAINER,
    ActorsDied,
    JobActors,
    actor_id,
    is_actor_death,
)
from sc_app.attempt.data_plane_start import bootstrap_data_plane
from sc_app.attempt.in_job_restore import Reset, ResetFailed
from sc_app.attempt.setup import (
    Restored,
    RestoreFailed,
    Setup,
    SetupOrder,
    TQPolicy,
    controller_args,
    start_controller_actor,
)
from sc_app.attempt.spares import Spares
from sc_app.checkpoint import ResumePlan, layout
from sc_app.checkpoint.dataset import DatasetRecord
from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.remote.parts import RemoteLink
from sc_app.config.app import AppConfig
from sc_app.data_plane.guard import GUARD_NAME, get_guard
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, clear_all_rows, shutdown_transferqueue
from sc_app.faults import fault_point
from sc_app.io import torch_files
from sc_app.rl.generation import GenerationWorker
from sc_app.rl.trainer import TrainerWorker
from sc_app.waits import Bound, ProcessHung, bounded, current, in_thread

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobIdentity:
    """What every set-up of the attempt is given (``setup_single_controller``'s keywords)."""

    run_id: str
    lease: Lease | None
    lineage: str | None
    dataset: DatasetRecord | None
    remote: RemoteLink | None = None  # checkpoint.remote.parts=direct: bundles are committed on the bucket


def _bounded(refs: list[Any], timeout_s: float, what: str) -> list[Any]:
    """``worker_results`` within ``timeout_s``: a death is ``ActorsDied`` material (raised as is), any other error
    or the timeout ``ResetFailed``."""
    try:
        return list(ray.get(refs, timeout=timeout_s)) if refs else []
    except ray.exceptions.GetTimeoutError:
        raise ResetFailed(f"{what} did not finish within run.reset_timeout_s={timeout_s:g}s") from None
    except Exception as exc:
        if is_actor_death(exc):
            raise
        raise ResetFailed(f"{what} failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}") from exc


def _in_thread(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``fn()`` (a call into TransferQueue, which has no timeout) within ``timeout_s``: past it ``ResetFailed``."""
    try:
        return in_thread(fn, what=what, bound=Bound.within(timeout_s))
    except ProcessHung:
        raise ResetFailed(f"{what} did not finish within run.reset_timeout_s={timeout_s:g}s") from None


def _wait_gone(name: str, namespace: str, timeout_s: float) -> None:
    """Until the named actor is gone (``ray.kill`` is asynchronous), at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.1)
    raise ResetFailed(f"the old {name} did not go within {timeout_s:g}s")


def dead_actors(handles: list[Any]) -> set[int]:
    """Positions in ``handles`` of the actors the GCS lists as dead."""
    from ray._private import state

    job = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())
    table = state.actors(job_id=job, actor_state_name="DEAD")
    return {i for i, h in enumerate(handles) if actor_id(h) in table}


def halt_controller(actor: Any, timeout_s: float) -> list[Any] | None:
    """Stop a live controller's run in place; returns the generation workers it used (None: it is dead)."""
    try:
        return list(ray.get(actor.halt.remote(timeout_s), timeout=timeout_s + 10))
    except ray.exceptions.GetTimeoutError:
        raise ResetFailed(f"the controller actor did not halt within {timeout_s:g}s") from None
    except Exception as exc:
        if is_actor_death(exc):
            return None
        raise ResetFailed(f"the controller actor could not halt: {type(exc).__name__}: {exc}") from exc


class WarmReset:
    """One warm reset of ``setup`` (the module docstring); ``run`` returns the reset setup and its report."""

    def __init__(
        self,
        cfg: AppConfig,
        who: JobIdentity,
        epoch: int,
        timeout_s: float,
        gone: frozenset[str] = frozenset(),
        spares: Spares | None = None,
    ) -> None:
        """``gone``: ids of actors to treat as dead whatever the GCS says yet (killed as hung: ``ray.kill`` is
        asynchronous). ``spares``: the attempt's spare trainer ranks, if any."""
        self.cfg, self.who, self.epoch, self.timeout_s, self.gone = cfg, who, epoch, timeout_s, gone
        self.spares = spares
        self.report = Reset()
        self._t = time.perf_counter()

    def _lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.report.seconds[phase] = self.report.seconds.get(phase, 0.0) + now - self._t
        self._t = now

    def run(
        self, setup: Setup, plan: ResumePlan, generators: list[Any] | None, keep_data_plane: bool
    ) -> tuple[Setup, Reset]:
        """Pre: the lease moved on, ``plan`` made as its holder, the controller halted (``generators``: its
        workers; None when it is dead). ``keep_data_plane``: every TransferQueue actor lives (cleared, refilled)."""
        assert setup.policy is not None
        fault_point("restore.warm")  # tests: a warm reset that fails, for the fallback to the full rebuild
        policy, order = setup.policy, SetupOrder()
        if generators is not None:
            policy.generators[:] = generators
        if self.spares is not None:
            self.spares.drop_unplaced()
        self._data_plane(setup, keep_data_plane)
        trainer_calls = self._trainers(policy, plan)
        generator_calls = self._generators(policy)
        policy.dp_client = self._start_data_plane()  # a fresh TransferQueue, or the cleared one attached to
        order.enter("bootstrap_client")
        self._lap("data_plane_start")
        fault_point("restore.warm.started")  # tests: the same, once it started actors of its own (they must go too)
        restored = self._restore(policy, plan, order, trainer_calls)
        policy.dp_client.seal({"decision": plan.decision, "step": restored.step, "run_id": self.who.run_id})
        order.enter("sealed")
        for got in _bounded(generator_calls, self.timeout_s, "the generation workers' reset"):
            self.report.refused += got.refused if hasattr(got, "refused") else 0
        policy.weights.epoch = self.epoch
        sync = self._within("the weight sync to the generation workers")
        policy.weights.push_blocking(policy.generators, restored.version, get=sync)
        self._lap("reload")
        setup.actor = self._controller(setup, policy, restored, generators is not None)
        order.enter("actor")
        _bounded([setup.actor.restore.remote()], self.timeout_s, "the controller's restore")
        self._lap("reload")
        setup.handles = [*policy.trainers, *policy.generators, setup.actor]
        return setup, self.report

    def _data_plane(self, setup: Setup, keep: bool) -> None:
        """Clear a live data plane in place (its rows removed), or close it — the old data plane and everything a
        zombie could still write to it — for a new one to start; then reopen the restore guard (kept: no actor
        start) for the new bootstrap client's restore and seal."""
        units = self.cfg.data_plane.storage_units
        if keep:
            try:
                rows = _in_thread(clear_all_rows, self.timeout_s, "clearing the data plane")
            except ResetFailed:
                raise
            except Exception as exc:
                raise ResetFailed(f"clearing the data plane failed: {type(exc).__name__}: {exc}") from exc
            self.report.reset.append(f"TransferQueue (controller + {units} units: {rows} rows cleared)")
        else:
            shutdown_transferqueue()
            _wait_gone("TransferQueueController", "transfer_queue", self.timeout_s)
            self.report.restarted.append(f"TransferQueue (controller + {units} units)")
        guard = get_guard(self.cfg.ray.namespace, create=True)  # the sealed one, or a new one if it is gone
        try:
            _bounded([guard.reopen.remote()], self.timeout_s, "reopening the restore guard")
        except ray.exceptions.RayActorError:  # it died (its node lost): the bootstrap client below starts a new one
            log.warning("the restore guard died; a new one is started")
            ray.kill(guard)
            _wait_gone(GUARD_NAME, self.cfg.ray.namespace, self.timeout_s)
        self._lap("data_plane_clear" if keep else "data_plane_close")

    def _start_data_plane(self) -> TransferQueueDataPlane:
        """The bootstrap client (TransferQueue started, or attached to) within the reset's timeout."""
        why = f"run.reset_timeout_s={self.timeout_s:g}s"
        try:
            with bounded(Bound.within(self.timeout_s, current().stop, why=why)):
                return bootstrap_data_plane(self.cfg)
        except ProcessHung as exc:
            raise ResetFailed(str(exc)) from None

    def _within(self, what: str) -> Callable[[list[Any]], list[Any]]:
        """Awaiting ``what``'s calls within the reset's timeout (``_bounded``)."""
        return lambda refs: _bounded(refs, self.timeout_s, what)

    def _trainers(self, policy: TQPolicy, plan: ResumePlan) -> list[Any]:
        """Replace dead ranks, reset (or, when the group must form again, rejoin) live ones; returns the calls."""
        cfg_json, world = self.cfg.model_dump_json(), self.cfg.trainer.num_workers
        tcfg = self.cfg.trainer
        dead = self._dead(policy.trainers)
        taken: list[Any] = []  # spares' take_rank calls, first in their queues
        for rank in sorted(dead):
            spare = self.spares.take() if self.spares is not None else None
            if spare is not None:
                policy.trainers[rank] = spare.handle
                taken.append(spare.handle.take_rank.remote(rank))
                self.report.restarted.append(f"trainer rank {rank} (spare pid {spare.pid} took its place)")
                continue
            policy.trainers[rank] = TrainerWorker.options(
                num_cpus=tcfg.num_cpus, num_gpus=tcfg.num_gpus, resources=tcfg.resources or None
            ).remote(cfg_json, rank, world)
            self.report.restarted.append(f"trainer rank {rank}")
        self.report.reset += [f"trainer rank {r}" for r in range(world) if r not in dead]
        reform = (bool(dead) and world > 1) or plan.decision != "resume"
        # first the reset of every live rank (its own thread: it ends a step of the old job blocked on the data plane)
        calls = [*taken, *(w.reset.remote(self.epoch) for r, w in enumerate(policy.trainers) if r not in dead)]
        addr, port = ("", 0)
        if reform and world > 1:
            addr, port = _bounded([policy.trainers[0].address.remote()], self.timeout_s, "trainer rank 0's store")[0]
        for rank, worker in enumerate(policy.trainers):
            if rank in dead:
                sees = [worker.sees_checkpoint_dir.remote(self.who.lease)] if self.who.lease is not None else []
                calls += [*sees, worker.setup.remote(addr, port), worker.reset.remote(self.epoch)]
            elif reform:
                calls.append(worker.rejoin.remote(addr, port, self.epoch))
        return calls

    def _dead(self, handles: list[Any]) -> set[int]:
        """Positions of the dead actors in ``handles``: the GCS's, and those killed as hung."""
        return dead_actors(handles) | {i for i, h in enumerate(handles) if actor_id(h) in self.gone}

    def _generators(self, policy: TQPolicy) -> list[Any]:
        """Replace dead engines (started and set up, like a first start), reset the live ones in place."""
        gcfg, cfg_json = self.cfg.generation, self.cfg.model_dump_json()
        dataset = self.who.dataset.sha256 if self.who.dataset else None
        dead = self._dead(policy.generators)
        calls = []
        for i, worker in enumerate(policy.generators):
            if i in dead:
                worker = policy.generators[i] = GenerationWorker.options(
                    num_cpus=gcfg.num_cpus, num_gpus=gcfg.num_gpus, resources=gcfg.resources or None
                ).remote(cfg_json, i)
                calls.append(worker.setup.remote(dataset))
                self.report.restarted.append(f"generation worker {i}")
            else:
                self.report.reset.append(f"generation worker {i}")
            calls.append(worker.reset.remote(self.epoch))
        return calls

    def _restore(self, policy: TQPolicy, plan: ResumePlan, order: SetupOrder, calls: list[Any]) -> Restored:
        """Seed steps 1-2: the trainers load the bundle (in place) while the new data plane is restored."""
        if plan.decision != "resume" or plan.bundle is None:
            got = _bounded(calls, self.timeout_s, "the trainers' reset")
            self._note(got, policy)
            return Restored()
        bundle, manifest = plan.bundle, plan.reports[-1].manifest
        assert manifest is not None
        order.enter("trainer_state")
        policy_dir = bundle / layout.POLICY_DIR
        policy.lease = self.who.lease  # the fence advanced it: the set-up's lease now fails every check
        copies = self._within("the bundle's policy/ sent to the nodes without the checkpoint directory")
        loading = policy.load_trainer_state(policy_dir, manifest.hashes_under(layout.POLICY_DIR), copies)
        loader_state = torch_files.load(bundle / layout.LOADER_FILE)
        order.enter("data_plane_restore")
        restored = policy.load_data_plane_checkpoint(bundle / layout.DATA_PLANE_DIR)
        if restored.get("digest") != manifest.replay_digest:
            raise RestoreFailed(bundle, "the data plane's digest differs from the manifest's replay digest")
        self._note(_bounded(calls, self.timeout_s, "the trainers' reset"), policy)
        versions = _bounded(loading, self.timeout_s, f"the trainers' load of {bundle.name}")
        policy.copies.drop()
        fingerprint = None
        if self.cfg.run.trace_file:
            fingerprint = policy.fingerprint(self._within("the trainers' fingerprint of the restored state"))
        sidecar = str(bundle / layout.SIDECAR_FILE)
        return Restored(plan.step, int(versions[0]), loader_state, sidecar, restored, fingerprint)

    def _note(self, got: list[Any], policy: TQPolicy) -> None:
        """The kept ranks' reports: calls of older epochs they refused (each rank's count is its total so far)."""
        refused = {out.pid: out.refused for out in got if hasattr(out, "version_before")}
        self.report.refused += sum(refused.values())

    def _controller(self, setup: Setup, policy: TQPolicy, restored: Restored, alive: bool) -> Any:
        """The controller actor from the bundle's arguments: reset in place when alive, else started again."""
        who = self.who
        args = controller_args(
            self.cfg,
            policy,
            restored,
            run_id=who.run_id,
            lease=who.lease,
            lineage=who.lineage,
            dataset=who.dataset,
            epoch=self.epoch,
            remote=who.remote,
        )
        if alive:
            _bounded([setup.actor.reset.remote(args)], self.timeout_s, "the controller actor's reset")
            self.report.reset.append("the controller actor")
            return setup.actor
        self.report.restarted.append("the controller actor")
        return start_controller_actor(args)


def actors_died_during_reset(setup: Setup, controller_was_dead: bool, wait_s: float = 5.0) -> ActorsDied | None:
    """The job's actors that are dead now (a death during the reset: the GCS's record, with its time), as
    ``ActorsDied``; None when none is. A controller actor dead before the reset (the death being restored) is not
    a new death."""
    assert setup.policy is not None
    watched = {actor_id(t): (TRAINER, f"trainer rank {r}") for r, t in enumerate(setup.policy.trainers)}
    watched |= {actor_id(g): (GENERATION, f"generation worker {i}") for i, g in enumerate(setup.policy.generators)}
    if setup.actor is not None and not controller_was_dead:
        watched[actor_id(setup.actor)] = (CONTROLLER, "the controller actor")
    dead = JobActors(watched).wait_dead(wait_s)
    return ActorsDied(dead) if dead else None
