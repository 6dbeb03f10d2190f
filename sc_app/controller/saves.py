"""The controller's saves (seed flows 5 and 6): ``SaveCoordinator`` owns every piece of save state — the save in
flight, its I/O thread, the trainers' captured version, the newest published step, the recent durations, the steps
no bundle covers yet — and the controller drives it through five calls from its train pump:

* ``due(step)``: whether a bundle is cut at ``step``;
* ``before_capture()`` then ``captured(version)``: around a train step that copies the trainers' state;
* ``start(step, version)``: cut a bundle of the step reached (returns once its content is fixed);
* ``collect(wait=...)``: report the save in flight once it is done;
* ``emergency(...)`` on a stop request and ``settle()`` when the run ends.

Invariants:
* a save pauses training only while its content is fixed (``capture``: trainer state copy, loader place, the
  barrier window); ``start`` returns once the window closed (or the save already ended); the rest is written
  behind training (``sc_app.checkpoint.save.write_bundle``);
* at most one save is in flight: the next save, the end of the run and a stop request each await it first; a train
  step that copies the trainers' state for the next bundle first awaits the in-flight save's policy write
  (``before_capture``), so that write never reads the newer copy;
* a failed save's I/O error is reported per ``checkpoint.on_save_error``; ``LeaseLost`` always stops the run;
* after a stop request (``stopping``) no periodic save starts; ``emergency`` waits for the save in flight only as
  long as the stop's deadline allows (``checkpoint.emergency.in_flight_wait``), else abandons it — never renamed,
  its tmp dir left for the next holder's tidy to quarantine — and then tries the bundle of the step reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import ray
import torch

from sc_app import __version__
from sc_app.checkpoint import BundleWriter, hmac_key_from_env
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.emergency import in_flight_wait, plan_emergency
from sc_app.checkpoint.lease import CheckpointDirNotShared, Lease, LeaseLost
from sc_app.checkpoint.remote.fence import RemoteLeaseLost
from sc_app.checkpoint.remote.parts import RemoteLink
from sc_app.checkpoint.remote.store import RemoteError
from sc_app.checkpoint.save import CapturedSave, write_bundle
from sc_app.checkpoint.writer import FileRecord
from sc_app.config.app import AppConfig
from sc_app.controller.bucket_commit import BucketCommit
from sc_app.controller.gather import gather_policy
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneSnapshot
from sc_app.data_plane.replay_buffer import TQReplayBuffer
from sc_app.faults import afault_point
from sc_app.io.background import background_executor, run_blocking
from sc_app.io.durable import os_error_line
from sc_app.progress import ProgressRecord, SaveFailedRecord, SaveRecord, StepRecord, StopRecord, step_summary
from sc_app.rl.factory import policy_format
from sc_app.rl.loader import PromptLoader

log = logging.getLogger(__name__)


class InventoryMismatch(RuntimeError):
    """Rows stored in the data plane differ from the replay index; no bundle is cut from such a state."""


class SaveFailed(RuntimeError):
    """A save failed and ``checkpoint.on_save_error=stop``; older bundles are intact."""


def _versions() -> dict[str, str]:
    import transfer_queue

    tq = getattr(transfer_queue, "__version__", "0.1.11")
    return {"sc_app": __version__, "ray": ray.__version__, "torch": torch.__version__, "transferqueue": tq}


class SaveArgs(Protocol):
    """What a save reads of ``SingleControllerActorArgs``."""

    run_id: str
    trainers: list[Any]
    lease: Lease | None
    lineage: str | None
    dataset: dict[str, Any] | None
    remote: RemoteLink | None  # checkpoint.remote.parts=direct: bundles are committed on the bucket


class SaveCoordinator:
    """The controller's saves (the module docstring). Built by the controller's ``restore()`` on its data-plane
    client and replay buffer; ``report`` receives every save's record in order, ``trace`` the save events."""

    def __init__(
        self,
        cfg: AppConfig,
        args: SaveArgs,
        *,
        barrier: DataPlaneCheckpointBarrier,
        buffer: TQReplayBuffer,
        client: DataPlaneClient,
        loader: PromptLoader,
        last_saved: int,
        report: Callable[[ProgressRecord], None],
        trace: Callable[..., None],
    ) -> None:
        self.cfg, self.args = cfg, args
        self.barrier, self.buffer, self.client, self.loader = barrier, buffer, client, loader
        self._report, self._trace = report, trace
        self.last_saved = last_saved  # the step of the newest published bundle (the start step before any)
        self.captured_version = -1  # the trainer version whose state the trainers hold a copy of
        self._pending: tuple[int, asyncio.Task[SaveRecord | SaveFailedRecord]] | None = None
        self.abandon = False  # settle() leaves the save in flight to end on its own (a warm in-job restore)
        self._io = background_executor("save-io")
        self._seconds: list[float] = []  # the newest saves' durations (checkpoint.emergency.plan_emergency)
        self._failed_in_a_row = 0
        self._unsaved_steps: list[StepRecord] = []  # steps since the newest published bundle: the next one keeps them
        self._policy_written = asyncio.Event()  # set once the save in flight's trainers wrote their copy
        self._policy_written.set()  # (no save yet: the trainers' copy is free)
        self._writer: BundleWriter | None = None  # the newest save's writer (``emergency`` may abandon its save)
        self._bucket = BucketCommit(cfg, args.remote) if args.remote is not None else None
        self.stopping = asyncio.Event()  # a stop was requested: no periodic save starts from now on

    # ------------------------------------------------------------------ what the train pump calls
    def due(self, step: int) -> bool:
        return step % self.cfg.checkpoint.save_period == 0 or step == self.cfg.run.max_steps

    def note_step(self, record: StepRecord) -> None:
        """A step trained: the next bundle records it (and every other step since the newest published one)."""
        self._unsaved_steps.append(record)

    def captured(self, version: int) -> None:
        """The trainers copied their state at ``version`` inside the step (the next save writes that copy)."""
        self.captured_version = version

    async def before_capture(self) -> None:
        """Before the trainers replace their state copy: the save in flight wrote the copy it captured (or ended)."""
        if self._pending is not None:
            await _until(self._policy_written, self._pending[1])

    async def start(self, step: int, version: int, *, emergency: bool = False) -> None:
        """Cut a bundle of ``step`` at weights ``version`` (``emergency``: on a stop request); returns once its
        window closed (or the save already ended).

        Pre: called from the train pump only. Post: the previous save has finished and been reported; the new
        one's policy, loader place and captured rows are fixed, the rest runs in the background. A periodic save
        is not started once a stop was requested (also while it waited for the previous one)."""
        if not emergency:
            if self._pending is not None:
                await _until(self.stopping, self._pending[1])
            if self.stopping.is_set():
                return
        await self.collect(wait=True)
        released = asyncio.Event()
        self._policy_written = asyncio.Event()
        task = asyncio.create_task(self._save_or_report(step, version, released, emergency))
        self._pending = (step, task)
        await _until(released, task)

    async def collect(self, *, wait: bool) -> None:
        """Take the save in flight once done (``wait``: await it); re-raise what stops the run, report I/O failures."""
        if self._pending is None:
            return
        step, task = self._pending
        if not wait and not task.done():
            return
        self._pending = None
        outcome = await task
        if not isinstance(outcome, SaveRecord):  # a published bundle was reported by ``_save``
            self._report(outcome)
        else:
            self._seconds = [*self._seconds, outcome.seconds][-8:]
            self.last_saved = step
            self._failed_in_a_row = 0
            self._unsaved_steps = [r for r in self._unsaved_steps if r.step > step]

    async def emergency(self, step: int, version: int, deadline: float | None) -> bool:
        """On a stop request: the save in flight as far as ``deadline`` (``time.time()``) allows, else abandoned;
        then a bundle of ``step`` (unless one is published), started only when the recent saves say it finishes
        before ``deadline`` (``sc_app.checkpoint.emergency``). Returns True when that bundle was left out."""

        def left() -> float:
            return float("inf") if deadline is None else deadline - time.time()

        if self._pending is not None:
            in_flight, task = self._pending
            wait_s = in_flight_wait(self._seconds, left(), same_step=in_flight == step)
            finished = bool((await asyncio.wait([task], timeout=wait_s))[0])
            if not finished and await self._abandon(step) and in_flight == step:
                return True  # the bundle of this step itself could not finish: no second try
        await self.collect(wait=True)
        if self.last_saved == step:
            return False
        newest = f"step_{self.last_saved}" if self.last_saved else None
        plan = plan_emergency(self._seconds, left(), newest_bundle=newest)
        if plan.start and not await _within(self._policy_written, left()):
            line = "emergency bundle skipped: the trainers are still writing the abandoned save's policy"
            self._report(StopRecord(step, f"{line}; {newest or 'no bundle'} stays the resume point"))
            return True
        self._report(StopRecord(step, plan.line))
        if plan.start:
            await self.start(step, version, emergency=True)
            await self.collect(wait=True)
        return not plan.start

    async def _abandon(self, stop_step: int) -> bool:
        """Give up the save in flight (a stop cannot wait for it): never renamed from now on, its tmp dir left
        for quarantine, its I/O thread left to it; the captured rows thawed. False when it is being renamed (it
        publishes: ``collect`` reports it)."""
        assert self._pending is not None
        step, task = self._pending
        if self._writer is None or not await self._in_background(self._writer.abandon):
            return False
        self._pending = None
        task.add_done_callback(_retrieve)
        self._io.shutdown(wait=False)
        self._io = background_executor("save-io")  # the old thread may be stuck in the abandoned save's I/O
        if self.buffer.frozen:
            await self.buffer.thaw()
        log.warning("save of step %d abandoned on a stop request", step)
        self._trace(ev="save_abandoned", step=step)
        self._report(
            StopRecord(
                stop_step,
                f"save of step_{step} abandoned: it would not finish within the stop's budget; never renamed, the "
                "next start quarantines its tmp dir",
            )
        )
        return True

    async def settle(self) -> None:
        """The run is over (or failing): the save in flight ends on its own (cancelling it could race its commit
        thread; an unfinished bundle is never renamed anyway), then the I/O thread goes. ``abandon``: a warm
        in-job restore halts the run: the save is left to end on its own (the lease moved on: it cannot publish)."""
        if self._pending is not None and self.abandon:
            log.warning("save of step %d abandoned: the job is being restored in-job", self._pending[0])
            self._pending[1].add_done_callback(_retrieve)  # it ends failing: its client is fenced
        elif self._pending is not None:
            (outcome,) = await asyncio.gather(self._pending[1], return_exceptions=True)
            if isinstance(outcome, BaseException):
                log.warning("save of step %d failed while the run was failing: %r", self._pending[0], outcome)
        self._io.shutdown(wait=False)

    # ------------------------------------------------------------------ one save
    async def _in_background(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run blocking save I/O on the low-priority save thread (training threads get the CPU first)."""
        return await run_blocking(self._io, fn, *args, **kwargs)

    async def _save_or_report(
        self, step: int, version: int, released: asyncio.Event, emergency: bool = False
    ) -> SaveRecord | SaveFailedRecord:
        """Save; a failed save (full disk, I/O error) is reported per ``checkpoint.on_save_error``.

        ``LeaseLost`` always propagates: a superseded run must stop, not keep training.
        """
        try:
            return await self._save(step, version, released, emergency)
        except (LeaseLost, RemoteLeaseLost):
            raise
        except (OSError, CheckpointDirNotShared, RemoteError) as exc:
            msg = (
                f"save of step {step} to {self.cfg.checkpoint.dir} failed: {os_error_line(exc)}; "
                "its tmp dir was removed and every older bundle is intact"
            )
            self._failed_in_a_row += 1
            log.error(msg)
            if self._failed_in_a_row >= 2:
                log.warning(
                    "%d saves in a row failed; the newest bundle is %s, %d steps behind",
                    self._failed_in_a_row,
                    f"step_{self.last_saved}" if self.last_saved else "none",
                    step - self.last_saved,
                )
            self._trace(ev="save_failed", step=step, error=str(exc))
            if self.cfg.checkpoint.on_save_error == "stop":
                raise SaveFailed(msg + " (checkpoint.on_save_error=stop)") from None
            return SaveFailedRecord(step, msg, in_a_row=self._failed_in_a_row, last_saved_step=self.last_saved)

    async def _save(self, step: int, version: int, released: asyncio.Event, emergency: bool = False) -> SaveRecord:
        """Capture (training paused until ``released`` is set), then write behind training; report once published
        (now, not at the next ``collect``: a fault during the step under way must not drop the record)."""
        cfg = self.cfg
        t0 = time.perf_counter()
        writer = BundleWriter(cfg.checkpoint.dir, step, hmac_key=hmac_key_from_env(), lease=self.args.lease)
        self._writer = writer
        if cfg.data_plane.snapshot == "native":  # TransferQueue's own save writes into tmp_step_N/ in the window
            await self._in_background(writer.begin)
        captured, snapshot, window = await self.capture(writer, step=step, version=version)
        paused = time.perf_counter() - t0
        released.set()  # the train pump goes on; drops of captured groups wait for thaw()
        published = await write_bundle(
            captured,
            snapshot,
            writer,
            write_policy=self._write_policy,
            thaw=self.buffer.thaw,
            manifest_record=captured.manifest_record(
                group_size=cfg.grpo.group_size,
                partition=cfg.data_plane.partition,
                compat=compat_of(cfg),
                versions=_versions(),
                dataset=self.args.dataset,
                policy_format=policy_format(cfg),
            ),
            keep=cfg.checkpoint.keep,
            in_background=self._in_background,
            executor=self._io,
            publish=self._bucket.publish if self._bucket is not None else None,
        )
        self._trace(ev="save", step=captured.step, digest=captured.digest, groups=captured.groups)
        up = published.on_bucket  # checkpoint.remote.parts=direct: committed on the bucket (its UploadResult)
        self._report(record := SaveRecord(captured.step, published.path.name, time.perf_counter() - t0, paused,
                     window, captured.groups, published.data_plane_bytes, published.pruned, emergency,
                     on_bucket=up is not None, uploaded_bytes=up.bytes if up else 0))  # fmt: skip
        return record

    async def capture(
        self, writer: BundleWriter, *, step: int, version: int
    ) -> tuple[CapturedSave, DataPlaneSnapshot, float]:
        """Fix the content of the bundle of ``step`` in the seed's order: the trainer's state copy at ``version``
        (already taken inside the step a save is due at; taken now for a stop request), the loader place, then the
        barrier window — the index, ``list_samples()`` must equal it, the data-plane capture, and the freeze of the
        captured rows. Returns the capture, the data plane's snapshot of the captured rows and the window's
        seconds."""
        cfg = self.cfg
        captured_version = self.captured_version
        if captured_version != version:  # e.g. a stop request: copy now, on every rank
            versions = await asyncio.gather(*[t.capture_state.remote() for t in self.args.trainers])
            captured_version = min(versions)
        if captured_version != version:
            raise RuntimeError(f"trainer captured version {captured_version}, the controller is at {version}")
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
                    f"step {step}: data plane holds {len(stored)} rows, index lists {self.buffer.rows}"
                )
            captured = CapturedSave(
                step=step,
                run_id=self.args.run_id,
                lineage=self.args.lineage,
                fencing_epoch=lease.fencing_epoch if lease is not None else 0,
                weights_version=version,
                loader_state=loader_state,
                replay_index=replay_index,
                steps=tuple(step_summary(r) for r in self._unsaved_steps if r.step <= step),
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
        """Every trainer writes the state it copied in the window, in parallel (each on its io thread; a part on a
        node's own disk is gathered); returns the files they hashed as they wrote them. An I/O error stays one."""
        trainers, bucket = self.args.trainers, self._bucket
        target = bucket.target(self._writer) if bucket is not None and self._writer is not None else None
        try:
            written = await asyncio.gather(*[t.write_captured.remote(str(policy_dir), target) for t in trainers])
            if bucket is not None:
                bucket.note(written)  # parts the ranks uploaded to the bucket themselves: not gathered
            return await gather_policy(trainers, written, policy_dir, self._in_background)  # parts on nodes' disks
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, OSError | CheckpointDirNotShared | RemoteError):  # a full disk, a lost mount
                raise exc.cause from None
            raise
        finally:
            self._policy_written.set()  # the trainers may take a new copy (``before_capture``)


async def _within(event: asyncio.Event, seconds: float) -> bool:
    """Whether ``event`` is set within ``seconds``."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))
    return event.is_set()


def _retrieve(task: asyncio.Task[Any]) -> None:
    """An abandoned save's end, whatever it is, is nobody's error (asyncio would log it as never retrieved)."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("an abandoned save ended: %r (while handling %r)", error, error.__context__)


async def _until(event: asyncio.Event, task: asyncio.Task[Any]) -> None:
    """Until ``event`` is set or ``task`` ended, whichever comes first."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
