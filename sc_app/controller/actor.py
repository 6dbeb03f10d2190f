"""SingleControllerActor: one Ray actor, one asyncio loop — rollout pumps, sampler, train pump, save.

A plain class: the driver makes it a Ray actor (``ray.remote(SingleControllerActor)``), and unit tests run it in
process with fake workers and a fake data plane (``connect=``). It holds two collaborators and hands them what they
need explicitly: ``saves`` (``SaveCoordinator``: every piece of save state, the barrier window) and ``recovery``
(``InJobRecovery``: the retrying data-plane client, the generation supervisor).

``__init__`` builds nothing: everything arrives built in one ``SingleControllerActorArgs`` (seed flow 2). Only the
connect-only data-plane client is built in ``restore()`` (a live client cannot be pickled), after the driver sealed
the restore decision (the shared guard refuses it before). The driver awaits ``restore()``, then ``run()``.

Invariants:
* commits and drops go through ``barrier.mutation()`` (inside ``TQReplayBuffer``); the advantage stage (read
  rows back, write advantages onto the same rows) takes no barrier slot and never changes which rows exist;
* a save pauses training only while its content is fixed (``SaveCoordinator.capture``); the rest follows behind
  training in ``sc_app.checkpoint.save.write_bundle``, which states the whole save order. At most one save is in
  flight: the next save, the end of the run and a stop request each await it first;
* a group trains only while ``version - group.version <= grpo.max_staleness`` (the sampler drops older ones);
* the index is loaded and checked against ``list_sample_ids()`` before any pump starts (``restore`` before ``run``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.checkpoint.verify import read_sidecar
from sc_app.config.app import AppConfig
from sc_app.controller.args import Connect, SingleControllerActorArgs, connect_transferqueue, disconnect_transferqueue
from sc_app.controller.recovery import InJobRecovery, log_rollout_failure, rollout_failure
from sc_app.controller.saves import InventoryMismatch, SaveCoordinator
from sc_app.controller.saves import SaveFailed as SaveFailed  # what a run's end maps to an exit code
from sc_app.controller.steps import keep_with_trainer, rollout_phases, step_record
from sc_app.data_plane import stream_io
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.replay_buffer import Group, GroupCommit, TQReplayBuffer
from sc_app.data_plane.retry import RetryingClient
from sc_app.phases import StepClock
from sc_app.progress import ProgressRecord, RunSummary, StepRecord
from sc_app.rl.backend import Rollout, TrainStepResult
from sc_app.rl.grpo import group_advantages
from sc_app.rl.loader import PromptLoader

log = logging.getLogger(__name__)


class _StopNow(Exception):
    """The driver asked to stop while the train pump was waiting for rollouts."""


def group_id_for(prompt_index: int) -> str:
    return f"p{prompt_index}"


class SingleControllerActor:
    client: RetryingClient  # connect-only (retried, fenced by ``halt``), built by restore()
    buffer: TQReplayBuffer  # built by restore() on the client
    saves: SaveCoordinator  # built by restore() on the client and the buffer

    def __init__(
        self,
        args: SingleControllerActorArgs,
        connect: Connect = connect_transferqueue,
        disconnect: Callable[[], None] = disconnect_transferqueue,
    ) -> None:
        self._connect, self._disconnect = connect, disconnect
        self._run_task: asyncio.Future[Any] | None = None
        self._fresh(args)

    def _fresh(self, args: SingleControllerActorArgs) -> None:
        """Every piece of state, from ``args`` alone (at start, and again by a warm in-job restore's ``reset``)."""
        self.args = args
        self.cfg = AppConfig.model_validate_json(args.cfg_json)
        self.barrier = DataPlaneCheckpointBarrier()
        self.loader = PromptLoader()
        self.version = args.start_version
        self.step = args.start_step
        self._progress: list[ProgressRecord] = []
        self._stop_requested = False
        self._stop_deadline: float | None = None  # time.time() by which an emergency bundle must be done
        self._cond = asyncio.Condition()  # wakes pumps and the sampler: buffer space, new groups, stop
        self._inflight = 0  # prompts taken by a rollout pump whose groups are not committed yet
        self._rollout_error: BaseException | None = None
        self._stopping = False
        self._restored = False
        self._trace_fh: Any = None
        self._rollout_seconds = {"generation": 0.0}  # summed over rollout pumps; read and reset per step record
        self.recovery = InJobRecovery(  # replaces a dead generation worker in-job, retries failed data-plane calls
            self.cfg,
            args,
            step=lambda: self.step,
            version=lambda: self.version,
            give_back=self._give_back,
            report=self._progress.append,
            trace=self._trace,
        )

    # ------------------------------------------------------------------ control surface for the driver
    def progress(self, since: int) -> list[ProgressRecord]:
        return self._progress[since:]

    async def request_stop(self, deadline: float | None = None) -> None:
        """Stop after the current step; ``deadline`` (``time.time()``) bounds the emergency bundle (emergency.py)."""
        self._stop_requested = True
        self._stop_deadline = deadline
        if hasattr(self, "saves"):
            self.saves.stopping.set()  # no periodic save starts after a stop
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ a warm in-job restore (in place)
    async def halt(self, timeout_s: float) -> list[Any]:
        """Stop ``run()`` in place (a save in flight is abandoned: the lease moved on, it cannot publish; the run's
        data-plane client fenced first); returns the generation workers in use. ``TimeoutError`` past ``timeout_s``."""
        task = self._run_task
        if task is not None and not task.done():
            self.saves.abandon = True
            self.client.fence("the controller was halted for an in-job restore")  # RetryingClient.fence: why
            task.cancel()
            if not (await asyncio.wait([task], timeout=timeout_s))[0]:
                raise TimeoutError(f"the controller's run did not stop within {timeout_s:g}s")
        return list(self.args.generators)

    async def reset(self, args: SingleControllerActorArgs) -> None:
        """After ``halt``: forget the old data plane and start again from ``args`` (the bundle's step, loader place,
        index, the new epoch). ``restore()`` then ``run()`` follow, as after a start."""
        self._disconnect()
        self._fresh(args)

    # ------------------------------------------------------------------ restore, then run
    async def restore(self) -> int:
        """Connect to the data plane, rebuild the index from the sidecar (no data-plane writes) and check it
        against the stored rows; returns the rows restored. ``SidecarError``, ``InventoryMismatch``: the bundle
        cannot be resumed (the driver falls back to an older one); ``CheckpointDirNotShared`` first: no fault of it."""
        if self.args.lease is not None:  # its node must see the directory: it reads the sidecar there, and saves
            self.args.lease.check_seen_by("the controller actor")
        cfg = self.cfg
        self.client = self.recovery.with_retries(self._connect(cfg))  # failed data-plane calls retried in-job
        dp = cfg.data_plane
        self.buffer = TQReplayBuffer(self.client, self.barrier, partition=dp.partition, group_size=cfg.grpo.group_size)
        self.saves = SaveCoordinator(
            cfg,
            self.args,
            barrier=self.barrier,
            buffer=self.buffer,
            client=self.client,
            loader=self.loader,
            last_saved=self.step,
            report=self._progress.append,
            trace=self._trace,
        )
        if self._stop_requested:
            self.saves.stopping.set()
        restored_rows = 0
        if self.args.sidecar_path is not None:
            meta = self.args.data_plane_checkpoint_metadata or {}
            self.buffer.load_state_dict(
                read_sidecar(Path(self.args.sidecar_path)), expected_digest=meta.get("digest", "")
            )
            restored_rows = self.buffer.rows
        stored = await self.client.list_sample_ids(cfg.data_plane.partition)
        if stored != self.buffer.sample_ids():
            raise InventoryMismatch(
                f"data plane holds {len(stored)} rows but the replay index lists {self.buffer.rows}; refusing to start"
            )
        if self.args.loader_state is not None:
            self.loader.load_state_dict(self.args.loader_state, skip=self.buffer.prompt_indices())
        self._restored = True
        return restored_rows

    async def run(self) -> RunSummary:
        """Run the pumps to ``run.max_steps`` or a stop request. Pre: ``restore()`` returned."""
        if not self._restored:
            raise RuntimeError("run() before restore(): the index must be rebuilt and checked before any pump")
        cfg = self.cfg
        self._run_task = asyncio.current_task()
        self._trace_fh = open(cfg.run.trace_file, "a") if cfg.run.trace_file else None  # noqa: SIM115
        restored = self.args.restored_fingerprint
        self._trace(
            ev="start",
            step=self.step,
            restored_rows=self.buffer.rows,
            run_id=self.args.run_id,
            restored_policy=None
            if restored is None
            else {"weights": restored.weights, "optimizer": restored.optimizer},
        )
        pumps = [asyncio.create_task(self._rollout_pump(i, w)) for i, w in enumerate(self.args.generators)]
        try:
            return await self._train_pump()
        finally:
            self._stopping = True
            async with self._cond:
                self._cond.notify_all()
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await self.saves.settle()  # a failed train pump leaves a save in flight: it ends on its own
            stream_io.shutdown_workers()  # snapshot streams this actor placed on other nodes, if any
            if self._trace_fh:
                self._trace_fh.close()

    @property
    def _epoch(self) -> tuple[int, ...]:  # the fencing epoch as a trailing call argument (none when unfenced)
        return () if self.args.epoch is None else (self.args.epoch,)

    def _trace(self, **event: Any) -> None:
        if self._trace_fh:
            self._trace_fh.write(json.dumps({"t": time.time(), **event}) + "\n")
            self._trace_fh.flush()

    # ------------------------------------------------------------------ rollout pump (flow 3)
    def _capacity_left(self, batch: int) -> bool:
        return len(self.buffer) + self._inflight + batch <= self.cfg.grpo.max_groups_buffered

    async def _rollout_pump(self, worker_index: int, worker: Any) -> None:
        grpo = self.cfg.grpo
        group_size = grpo.group_size
        batch = max(1, grpo.prompts_per_step // 2)  # prompts per generate call = groups per commit
        try:
            while not self._stopping:
                async with self._cond:
                    await self._cond.wait_for(lambda: self._stopping or self._capacity_left(batch))
                    if self._stopping:
                        return
                    idxs = [self.loader.take() for _ in range(batch)]
                    self._inflight += batch
                self._trace(ev="issue", prompts=idxs, worker=worker_index)
                try:
                    generating = time.perf_counter()
                    out: Rollout | None = await self.recovery.generation.generate(worker_index, idxs)
                    if out is None:  # the worker died: its prompts went back to the loader, a new one took over
                        continue
                    self._rollout_seconds["generation"] += time.perf_counter() - generating
                    self._trace(ev="rollout", prompts=idxs, worker=worker_index, version=out.version)
                    # the groups of the call in one put and one barrier slot (data_plane.groups_per_put caps it)
                    data = TensorDict(dict(out.fields), batch_size=len(idxs) * group_size)
                    per_put = self.cfg.data_plane.groups_per_put or len(idxs)
                    for lo in range(0, len(idxs), per_put):
                        chunk = idxs[lo : lo + per_put]
                        commits = [GroupCommit(group_id_for(i), i, out.version) for i in chunk]
                        await self.buffer.commit_groups(commits, data[lo * group_size : (lo + len(chunk)) * group_size])
                        for idx in chunk:
                            self.loader.settled(idx)
                        async with self._cond:
                            self._inflight -= len(chunk)
                            self._cond.notify_all()
                except BaseException:
                    async with self._cond:
                        self._inflight = max(0, self._inflight - sum(1 for i in idxs if i in self.loader.pending))
                    raise
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await self._rollout_failed(worker_index, exc)

    async def _drop(self, groups: list[Group]) -> None:
        """Clear groups through the barrier, then wake the rollout pumps waiting for buffer space."""
        await self.buffer.drop([group.group_id for group in groups])
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ sampler
    async def _sample(self, n: int) -> list[Group]:
        max_stale = self.cfg.grpo.max_staleness
        while True:
            stale = [group for group in self.buffer.groups() if self.version - group.version > max_stale]
            if stale:
                await self._drop(stale)
                self._trace(ev="drop_stale", prompts=[group.prompt_index for group in stale])
            fresh = self.buffer.groups()
            if len(fresh) >= n:
                return fresh[:n]
            if self._rollout_error is not None:  # a reward/input error or a spent recovery keeps its one line
                raise rollout_failure(self._rollout_error)
            if self._stop_requested:
                raise _StopNow
            async with self._cond:
                await self._cond.wait_for(
                    lambda: (
                        len(self.buffer) >= n
                        or self._rollout_error is not None
                        or self._stopping
                        or self._stop_requested
                    )
                )

    # ------------------------------------------------------------------ train pump
    async def _train_pump(self) -> RunSummary:
        """Train steps until ``run.max_steps`` or a stop request, each timed by phase; a save follows the step it
        is due at. Then the run's end: the save in flight, an emergency save on a stop request, the summary."""
        cfg = self.cfg
        rewards: list[float] = []
        rollout_mark = (self.buffer.times.copy(), self._rollout_seconds["generation"])
        while self.step < cfg.run.max_steps and not self._stop_requested:
            clock = StepClock()
            clear_mark = self.buffer.times.copy()
            try:
                groups = await self._sample(cfg.grpo.prompts_per_step)
            except _StopNow:
                break
            clock.lap("wait_rollouts")
            clock.move("wait_rollouts", "clear", self.buffer.times.clear - clear_mark.clear)  # stale drops
            staleness = sum(self.version - group.version for group in groups) / len(groups)
            reward, results = await self._train_step(groups, clock)
            rewards.append(float(reward.mean()))
            self._trace(ev="train", step=self.step, prompts=[group.prompt_index for group in groups])
            clock.add("barrier_wait", self.buffer.times.clear_wait - clear_mark.clear_wait)
            times = self.buffer.times.copy()
            rollout_mark = rollout_phases(clock, rollout_mark, times, self._rollout_seconds["generation"])
            self._record_step(step_record(clock, reward, results, staleness, self))
            if cfg.checkpoint.enabled and self.saves.due(self.step) and not self._stop_requested:
                await self.saves.start(self.step, self.version)
            await self.saves.collect(wait=False)
        return await self._end_run(rewards)

    async def _train_step(self, groups: list[Group], clock: StepClock) -> tuple[torch.Tensor, list[TrainStepResult]]:
        """One step on ``groups``: the advantage stage, the trainers (copying their state when a bundle will be
        cut at this step), the drop of the trained groups, the weight sync. Returns the rows' rewards."""
        ids = [sid for group in groups for sid in group.sample_ids]
        reward = await self._advantage_stage(groups, ids, clock)
        next_version = self.version + 1
        # the step a bundle will be cut at: the trainer copies its state right after it (no extra call then)
        capture = self.cfg.checkpoint.enabled and self.saves.due(self.step + 1)
        if capture:  # the new copy replaces the one a save still in flight may not have written yet
            await self.saves.before_capture()
        results: list[TrainStepResult] = await asyncio.gather(
            *[t.train_step.remote(ids, next_version, capture, *self._epoch) for t in self.args.trainers]
        )
        clock.lap("trainer")
        clock.add("trainer_get", max(r.get_seconds for r in results))
        if capture:
            self.saves.captured(next_version)
        self.version = next_version
        self.step += 1
        await self._drop(groups)
        clock.lap("clear")
        await self.recovery.sync_weights()
        clock.lap("weight_sync")
        return reward, results

    async def _advantage_stage(self, groups: list[Group], ids: list[str], clock: StepClock) -> torch.Tensor:
        """Seed flow 4: read the rows' rewards back, write ``advantage`` onto the same rows (no barrier slot: it
        never changes which rows exist, and it runs in the task that cuts saves). Returns the rewards."""
        group_ids = [group.group_id for group in groups]
        indexes = self.buffer.global_indexes(group_ids)  # no key lookup when known
        rows = await self.client.get_samples(self.cfg.data_plane.partition, ids, ["reward"], global_indexes=indexes)
        clock.lap("get")
        adv = group_advantages(rows["reward"], self.cfg.grpo.group_size)
        await self.buffer.write_fields(group_ids, TensorDict({"advantage": adv}, batch_size=len(ids)))
        clock.lap("advantage_write")
        reward: torch.Tensor = rows["reward"]
        return reward

    async def _end_run(self, rewards: list[float]) -> RunSummary:
        """The save in flight reported; on a stop request, a bundle of the step reached (unless it has one)."""
        cfg = self.cfg
        skipped = False  # the emergency bundle left out on purpose: it could not have finished in time
        if self._stop_requested and cfg.checkpoint.enabled:  # the save in flight only as long as the stop allows
            skipped = await self.saves.emergency(self.step, self.version, self._stop_deadline)
        else:
            await self.saves.collect(wait=True)
        return RunSummary(
            final_step=self.step,
            weights_version=self.version,
            first_rewards=rewards[:5],
            last_rewards=rewards[-5:],
            stopped_early=self._stop_requested and self.step < cfg.run.max_steps,
            last_saved_step=self.saves.last_saved,
            emergency_skipped=skipped,
        )

    def _record_step(self, record: StepRecord) -> None:
        self._progress.append(record)
        self.saves.note_step(record)
        keep_with_trainer(self.args.trainers, record)  # survives this actor's death (issue 31 C)

    # ------------------------------------------------------------------ the pumps' side of in-job recovery
    async def _give_back(self, idxs: list[int]) -> None:
        """A dead worker's prompts: back to the loader (re-issued first, once), out of the in-flight count."""
        back = self.loader.give_back(idxs)
        async with self._cond:
            self._inflight = max(0, self._inflight - len(back))
            self._cond.notify_all()

    async def _rollout_failed(self, worker_index: int, exc: BaseException) -> None:
        """A rollout pump ended with ``exc``: logged and kept for the sampler, which ends the run with
        ``rollout_failure(exc)``."""
        log_rollout_failure(worker_index, exc)
        self._rollout_error = exc
        async with self._cond:
            self._cond.notify_all()
