"""SingleControllerActor: one Ray actor, one asyncio loop — rollout pumps, sampler, train pump, save.

``__init__`` does no construction of other objects: everything arrives built in one ``SingleControllerActorArgs``
(seed flow 2). Only the connect-only data-plane client is built in ``restore()`` (a live client cannot be
pickled, so the driver cannot build it), after the driver sealed the restore decision — the shared guard refuses
it otherwise. The driver awaits ``restore()`` (index rebuilt from the sidecar, inventory checked), then ``run()``
starts the pumps.

Invariants:
* commits and drops go through ``barrier.mutation()`` (inside ``TQReplayBuffer``); the advantage stage (read
  rows back, write advantages onto the same rows) takes no barrier slot and never changes which rows exist;
* a save pauses training only while its content is fixed (``_capture``: trainer state copy, loader place, the
  barrier window); the rest follows behind training in ``sc_app.checkpoint.save.write_bundle``, which states the
  whole save order. At most one save is in flight: the next save, the end of the run and a stop request each
  await it first;
* the index is loaded and checked against ``list_sample_ids()`` before any pump starts (``restore`` before
  ``run``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from tensordict import TensorDict

from sc_app import __version__
from sc_app.background import background_executor, run_blocking
from sc_app.barrier import DataPlaneCheckpointBarrier
from sc_app.checkpoint import BundleWriter, hmac_key_from_env
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.lease import Lease, LeaseLost
from sc_app.checkpoint.save import CapturedSave, write_bundle
from sc_app.checkpoint.verify import read_sidecar
from sc_app.config import AppConfig
from sc_app.data_plane import stream_io
from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneSnapshot
from sc_app.faults import afault_point
from sc_app.phases import StepClock
from sc_app.policy.backend import FileRecord, PolicyFingerprint, Rollout, TrainStepResult, policy_format
from sc_app.policy.grpo import group_advantages
from sc_app.policy.hf.errors import HFInputError, RewardFailed
from sc_app.policy.loader import PromptLoader
from sc_app.progress import (
    ProgressRecord,
    RunSummary,
    SaveFailedRecord,
    SaveRecord,
    StepRecord,
    StopRecord,
    step_summary,
)
from sc_app.replay_buffer import BufferTimes, Group, GroupCommit, TQReplayBuffer

log = logging.getLogger(__name__)


class InventoryMismatch(RuntimeError):
    """Rows stored in the data plane differ from the replay index; no bundle is cut from such a state."""


class SaveFailed(RuntimeError):
    """A save failed and ``checkpoint.on_save_error=stop``; older bundles are intact."""


class _StopNow(Exception):
    """The driver asked to stop while the train pump was waiting for rollouts."""


@dataclass
class SingleControllerActorArgs:
    """Everything the controller needs, built on the driver, pickled once."""

    cfg_json: str
    run_id: str
    trainers: list[Any]
    generators: list[Any]
    start_step: int = 0
    start_version: int = 0
    loader_state: dict[str, Any] | None = None
    sidecar_path: str | None = None
    data_plane_checkpoint_metadata: dict[str, Any] | None = None  # what the driver restored (flow 1 → 2)
    lease: Lease | None = None
    lineage: str | None = None  # the checkpoint directory's lineage, recorded in every manifest
    dataset: dict[str, Any] | None = None  # the task's dataset file (path, sha256, rows): recorded in every bundle
    restored_fingerprint: PolicyFingerprint | None = None  # of the state the trainers restored (traced at start)


def _cause(exc: BaseException) -> BaseException:
    """The exception a worker raised, out of Ray's ``RayTaskError`` wrapper (itself when not wrapped)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def group_id_for(prompt_index: int) -> str:
    return f"p{prompt_index}"


def _versions() -> dict[str, str]:
    import transfer_queue

    return {
        "sc_app": __version__,
        "ray": ray.__version__,
        "torch": torch.__version__,
        "transferqueue": getattr(transfer_queue, "__version__", "0.1.11"),
    }


@ray.remote
class SingleControllerActor:
    client: DataPlaneClient  # connect-only, built by restore()
    buffer: TQReplayBuffer  # built by restore() on the client

    def __init__(self, args: SingleControllerActorArgs) -> None:
        self.args = args
        self.cfg = AppConfig.model_validate_json(args.cfg_json)
        self.barrier = DataPlaneCheckpointBarrier()
        self.loader = PromptLoader()
        self.version = args.start_version
        self.step = args.start_step
        self._progress: list[ProgressRecord] = []
        self._stop_requested = False
        self._cond = asyncio.Condition()  # wakes pumps and the sampler: buffer space, new groups, stop
        self._inflight = 0  # prompts taken by a rollout pump whose groups are not committed yet
        self._rollout_error: BaseException | None = None
        self._stopping = False
        self._pending_save: tuple[int, asyncio.Task[SaveRecord | SaveFailedRecord]] | None = None
        self._save_io = background_executor("save-io")
        self._captured_version = -1  # the trainer version whose state the trainer holds a copy of
        self._last_saved = self.step
        self._failed_saves_in_a_row = 0
        self._unsaved_steps: list[StepRecord] = []  # steps since the newest published bundle: the next one keeps them
        self._restored = False
        self._trace_fh: Any = None
        self._rollout_seconds = {"generation": 0.0}  # summed over rollout pumps; read and reset per step record

    # ------------------------------------------------------------------ control surface for the driver
    def progress(self, since: int) -> list[ProgressRecord]:
        return self._progress[since:]

    async def request_stop(self) -> None:
        self._stop_requested = True
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ restore, then run
    async def restore(self) -> int:
        """Connect to the data plane, rebuild the index from the sidecar (no data-plane writes) and check it
        against the stored rows; returns the rows restored. Raises (``SidecarError``, ``InventoryMismatch``) when
        the bundle cannot be resumed: the driver then falls back to an older bundle."""
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        cfg = self.cfg
        self.client = TransferQueueDataPlane(
            bootstrap=False, namespace=cfg.ray.namespace, snapshot=cfg.data_plane.snapshot
        )
        self.buffer = TQReplayBuffer(
            self.client,
            self.barrier,
            partition=cfg.data_plane.partition,
            group_size=cfg.grpo.num_generations_per_prompt,
        )
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
            if self._pending_save is not None:  # the train pump failed: let the save in flight end on its own
                # (cancelling it could race its commit thread; an unfinished bundle is never renamed anyway)
                (outcome,) = await asyncio.gather(self._pending_save[1], return_exceptions=True)
                if isinstance(outcome, BaseException):
                    log.warning("save of step %d failed while the run was failing: %r", self._pending_save[0], outcome)
            self._save_io.shutdown(wait=False)
            stream_io.shutdown_workers()  # snapshot streams this actor placed on other nodes, if any
            if self._trace_fh:
                self._trace_fh.close()

    def _trace(self, **event: Any) -> None:
        if self._trace_fh:
            self._trace_fh.write(json.dumps({"t": time.time(), **event}) + "\n")
            self._trace_fh.flush()

    # ------------------------------------------------------------------ rollout pump (flow 3)
    def _capacity_left(self, batch: int) -> bool:
        return len(self.buffer) + self._inflight + batch <= self.cfg.grpo.max_groups_buffered

    async def _rollout_pump(self, worker_index: int, worker: Any) -> None:
        grpo = self.cfg.grpo
        group_size = grpo.num_generations_per_prompt
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
                    out: Rollout = await worker.generate.remote(idxs)
                    self._rollout_seconds["generation"] += time.perf_counter() - generating
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
            if isinstance(_cause(exc), RewardFailed | HFInputError):  # one line names it; no traceback to show
                log.error("rollout pump %d: %s", worker_index, _cause(exc))
            else:
                log.exception("rollout pump %d failed", worker_index)
            self._rollout_error = exc
            async with self._cond:
                self._cond.notify_all()

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
            if self._rollout_error is not None:
                cause = _cause(self._rollout_error)
                if isinstance(cause, RewardFailed | HFInputError):  # typed: its one line names the function
                    raise cause
                raise RuntimeError("rollout pump failed") from self._rollout_error
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
        cfg = self.cfg
        partition = cfg.data_plane.partition
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
            ids = [sid for group in groups for sid in group.sample_ids]
            staleness = sum(self.version - group.version for group in groups) / len(groups)
            # advantage stage (flow 4): read rows back, overwrite one field on the same rows; no barrier slot
            indexes = self.buffer.global_indexes([group.group_id for group in groups])  # no key lookup when known
            rows = await self.client.get_samples(partition, ids, ["reward"], global_indexes=indexes)
            clock.lap("get")
            adv = group_advantages(rows["reward"], cfg.grpo.num_generations_per_prompt)
            await self.buffer.write_fields(
                [group.group_id for group in groups], TensorDict({"advantage": adv}, batch_size=len(ids))
            )
            clock.lap("advantage_write")
            next_version = self.version + 1
            # the step a bundle will be cut at: the trainer copies its state right after it (no extra call then)
            capture = cfg.checkpoint.enabled and self._save_due(self.step + 1)
            results: list[TrainStepResult] = await asyncio.gather(
                *[t.train_step.remote(ids, next_version, capture) for t in self.args.trainers]
            )
            clock.lap("trainer")
            clock.add("trainer_get", max(r.get_seconds for r in results))
            if capture:
                self._captured_version = next_version
            self.version = next_version
            self.step += 1
            await self._drop(groups)
            clock.lap("clear")
            await self._sync_weights()
            clock.lap("weight_sync")
            reward = rows["reward"]
            mean_reward = float(reward.mean())
            rewards.append(mean_reward)
            self._trace(ev="train", step=self.step, prompts=[group.prompt_index for group in groups])
            clock.add("barrier_wait", self.buffer.times.clear_wait - clear_mark.clear_wait)
            rollout_mark = self._rollout_phases(clock, rollout_mark)
            step_seconds, phases = clock.finish()
            self._record_step(
                StepRecord(
                    step=self.step,
                    reward=mean_reward,
                    loss=sum(r.loss for r in results) / len(results),
                    staleness=staleness,
                    rows_held=self.buffer.rows,
                    step_seconds=step_seconds,
                    reward_min=float(reward.min()),
                    reward_max=float(reward.max()),
                    weights_version=self.version,
                    commit_waits=self.barrier.stats.drain_mutation_waits(),
                    phase_seconds=phases,
                )
            )
            if cfg.checkpoint.enabled and self._save_due(self.step):
                await self._start_save()
            await self._collect_save(wait=False)
        await self._collect_save(wait=True)
        if self._stop_requested and cfg.checkpoint.enabled and self._last_saved != self.step:
            self._progress.append(StopRecord(self.step))
            await self._start_save(emergency=True)
            await self._collect_save(wait=True)
        return RunSummary(
            final_step=self.step,
            version=self.version,
            first_rewards=rewards[:5],
            last_rewards=rewards[-5:],
            stopped_early=self._stop_requested and self.step < cfg.run.max_steps,
            last_saved_step=self._last_saved,
        )

    def _rollout_phases(self, clock: StepClock, mark: tuple[BufferTimes, float]) -> tuple[BufferTimes, float]:
        """Charge the rollout pumps' generate and commit seconds since ``mark`` to the step; returns the new mark."""
        times, generation = self.buffer.times.copy(), self._rollout_seconds["generation"]
        clock.add("generation", generation - mark[1])
        clock.add("put", times.put - mark[0].put)
        clock.add("put_barrier_wait", times.put_wait - mark[0].put_wait)
        return times, generation

    async def _sync_weights(self) -> None:
        """The new version to every generation worker: one object (rank 0's ``get_weights`` result) for all of
        them. Every trainer takes part, as gathering a sharded model is collective; the others return None."""
        refs = [t.get_weights.remote() for t in self.args.trainers]
        await asyncio.gather(*[w.set_weights.remote(refs[0], self.version) for w in self.args.generators], *refs[1:])

    def _record_step(self, record: StepRecord) -> None:
        self._progress.append(record)
        self._unsaved_steps.append(record)

    # ------------------------------------------------------------------ save (flows 5 and 6)
    def _save_due(self, step: int) -> bool:
        return step % self.cfg.checkpoint.save_period == 0 or step == self.cfg.run.max_steps

    async def _start_save(self, *, emergency: bool = False) -> None:
        """Cut a bundle of the current step (``emergency``: on a stop request); returns once its window closed (or
        the save already ended).

        Pre: called from the train pump only. Post: the previous save has finished and been reported; the new
        one's policy, loader place and captured rows are fixed, the rest runs in ``self._pending_save``."""
        await self._collect_save(wait=True)
        released = asyncio.Event()
        task = asyncio.create_task(self._save_or_report(self.step, released, emergency))
        self._pending_save = (self.step, task)
        waiter = asyncio.ensure_future(released.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _collect_save(self, *, wait: bool) -> None:
        """Report the save in flight once it is done (``wait``: await it first). Re-raises what must stop the
        run (``LeaseLost``, ``SaveFailed``, a bug); a reported I/O failure lets training continue."""
        if self._pending_save is None:
            return
        step, task = self._pending_save
        if not wait and not task.done():
            return
        self._pending_save = None
        outcome = await task
        self._progress.append(outcome)
        if isinstance(outcome, SaveRecord):
            self._last_saved = step
            self._failed_saves_in_a_row = 0
            self._unsaved_steps = [r for r in self._unsaved_steps if r.step > step]

    async def _in_background(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run blocking save I/O on the low-priority save thread (training threads get the CPU first)."""
        return await run_blocking(self._save_io, fn, *args, **kwargs)

    async def _save_or_report(
        self, step: int, released: asyncio.Event, emergency: bool = False
    ) -> SaveRecord | SaveFailedRecord:
        """Save; a failed save (full disk, I/O error) is reported per ``checkpoint.on_save_error``.

        ``LeaseLost`` always propagates: a superseded run must stop, not keep training.
        """
        try:
            return await self._save(released, emergency)
        except LeaseLost:
            raise
        except OSError as exc:
            msg = (
                f"save of step {step} to {self.cfg.checkpoint.dir} failed: {exc.strerror or exc}; "
                "its tmp dir was removed and every older bundle is intact"
            )
            self._failed_saves_in_a_row += 1
            log.error(msg)
            if self._failed_saves_in_a_row >= 2:
                log.warning(
                    "%d saves in a row failed; the newest bundle is step_%d, %d steps behind",
                    self._failed_saves_in_a_row,
                    self._last_saved,
                    step - self._last_saved,
                )
            self._trace(ev="save_failed", step=step, error=str(exc))
            if self.cfg.checkpoint.on_save_error == "stop":
                raise SaveFailed(msg + " (checkpoint.on_save_error=stop)") from None
            return SaveFailedRecord(step, msg, in_a_row=self._failed_saves_in_a_row, last_saved_step=self._last_saved)

    async def _save(self, released: asyncio.Event, emergency: bool = False) -> SaveRecord:
        """Capture (training paused until ``released`` is set), then write behind training."""
        cfg = self.cfg
        t0 = time.perf_counter()
        writer = BundleWriter(cfg.checkpoint.dir, self.step, hmac_key=hmac_key_from_env(), lease=self.args.lease)
        if cfg.data_plane.snapshot == "native":  # TransferQueue's own save writes into tmp_step_N/ in the window
            await self._in_background(writer.begin)
        captured, snapshot, window = await self._capture(writer)
        blocked = time.perf_counter() - t0
        released.set()  # the train pump goes on; drops of captured groups wait for thaw()
        published = await write_bundle(
            captured,
            snapshot,
            writer,
            write_policy=self._write_policy,
            thaw=self.buffer.thaw,
            manifest_record=captured.manifest_record(
                group_size=cfg.grpo.num_generations_per_prompt,
                partition=cfg.data_plane.partition,
                compat=compat_of(cfg),
                versions=_versions(),
                dataset=self.args.dataset,
                policy_format=policy_format(cfg),
            ),
            keep=cfg.checkpoint.keep,
            in_background=self._in_background,
            executor=self._save_io,
        )
        self._trace(ev="save", step=captured.step, digest=captured.digest, groups=captured.groups)
        return SaveRecord(
            step=captured.step,
            bundle=published.path.name,
            seconds=time.perf_counter() - t0,
            blocked_seconds=blocked,
            window_seconds=window,
            groups=captured.groups,
            data_plane_bytes=published.data_plane_bytes,
            pruned=published.pruned,
            emergency=emergency,
        )

    async def _capture(self, writer: BundleWriter) -> tuple[CapturedSave, DataPlaneSnapshot, float]:
        """Fix the bundle's content in the seed's order: the trainer's state copy (already taken inside the step a
        save is due at; taken now for a stop request), the loader place, then the barrier window — the index,
        ``list_samples()`` must equal it, the data-plane capture, and the freeze of the captured rows.
        Returns the capture, the data plane's snapshot of the captured rows and the window's seconds."""
        cfg = self.cfg
        captured_version = self._captured_version
        if captured_version != self.version:  # e.g. a stop request: copy now, on every rank
            versions = await asyncio.gather(*[t.capture_state.remote() for t in self.args.trainers])
            captured_version = min(versions)
        if captured_version != self.version:
            raise RuntimeError(f"trainer captured version {captured_version}, the controller is at {self.version}")
        loader_state = self.loader.state_dict()  # a fresh dict of plain ints and lists
        lease = self.args.lease
        async with self.barrier.checkpoint():
            opened = time.perf_counter()
            await afault_point("save.window")
            replay_index = self.buffer.metadata_state_dict()
            listed = await self.client.list_samples(cfg.data_plane.partition)
            stored = set(listed)
            if stored != self.buffer.sample_ids():
                raise InventoryMismatch(
                    f"step {self.step}: data plane holds {len(stored)} rows, index lists {self.buffer.rows}"
                )
            captured = CapturedSave(
                step=self.step,
                run_id=self.args.run_id,
                lineage=self.args.lineage,
                epoch=lease.epoch if lease is not None else 0,
                trainer_version=self.version,
                loader_state=loader_state,
                replay_index=replay_index,
                steps=tuple(step_summary(r) for r in self._unsaved_steps if r.step <= self.step),
            )
            snapshot = await self.client.save_checkpoint(
                writer.data_plane_dir,
                captured.data_plane_metadata(),
                cfg.data_plane.partition,
                CapturedRows(sorted(stored), field_names=self.buffer.field_names_by_group(), tags=listed),
            )
            window = time.perf_counter() - opened
            self.buffer.freeze(stored)  # TQReplayBuffer.freeze: what the snapshot reads stays as captured
        return captured, snapshot, window

    async def _write_policy(self, policy_dir: Path) -> dict[str, FileRecord]:
        """Every trainer writes the state it copied in the window, in parallel (each on its io thread); returns
        the files they hashed as they wrote them. An I/O error stays one."""
        try:
            written = await asyncio.gather(*[t.write_captured.remote(str(policy_dir)) for t in self.args.trainers])
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, OSError):  # e.g. a full disk: report it as the I/O error it is
                raise exc.cause from None
            raise
        return {name: record for files in written for name, record in files.items()}
