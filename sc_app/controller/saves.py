"""The saves of ``SingleControllerActor`` (seed flows 5 and 6): at most one in flight, its content fixed in the
barrier window (``_capture``), the rest written behind training (``sc_app.checkpoint.save.write_bundle``).

``ControllerSaves`` is the save half of the controller class (a mixin: ``SingleControllerActor`` derives from it and
the two share the attributes declared below). The train pump calls ``_start_save`` when a save is due and
``_collect_save`` after every step; nothing else starts or reports a save.

Invariants:
* a save pauses training only while its content is fixed (``_capture``: trainer state copy, loader place, the
  barrier window); ``_start_save`` returns once the window closed (or the save already ended);
* the next save, the end of the run and a stop request each await the save in flight first; a train step that
  copies the trainers' state for the next bundle first awaits the in-flight save's policy write
  (``_policy_written``), so that write never reads the newer copy;
* a failed save's I/O error is reported per ``checkpoint.on_save_error``; ``LeaseLost`` always stops the run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import ray
import torch

from sc_app import __version__
from sc_app.checkpoint import BundleWriter, hmac_key_from_env
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.emergency import plan_emergency
from sc_app.checkpoint.lease import Lease, LeaseLost
from sc_app.checkpoint.save import CapturedSave, write_bundle
from sc_app.checkpoint.writer import FileRecord
from sc_app.config.app import AppConfig
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneSnapshot
from sc_app.data_plane.replay_buffer import TQReplayBuffer
from sc_app.faults import afault_point
from sc_app.io.background import run_blocking
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

    return {
        "sc_app": __version__,
        "ray": ray.__version__,
        "torch": torch.__version__,
        "transferqueue": getattr(transfer_queue, "__version__", "0.1.11"),
    }


class SaveArgs(Protocol):
    """What a save reads of ``SingleControllerActorArgs``."""

    run_id: str
    trainers: list[Any]
    lease: Lease | None
    lineage: str | None
    dataset: dict[str, Any] | None


class ControllerSaves:
    """The save half of ``SingleControllerActor``; these attributes are the controller's."""

    args: SaveArgs
    cfg: AppConfig
    barrier: DataPlaneCheckpointBarrier
    buffer: TQReplayBuffer
    client: DataPlaneClient
    loader: PromptLoader
    step: int
    version: int
    _progress: list[ProgressRecord]
    _pending_save: tuple[int, asyncio.Task[SaveRecord | SaveFailedRecord]] | None
    _save_io: ThreadPoolExecutor
    _captured_version: int  # the trainer version whose state the trainers hold a copy of
    _last_saved: int
    _save_seconds: list[float]  # the newest saves' durations (checkpoint.emergency.plan_emergency)
    _failed_saves_in_a_row: int
    _unsaved_steps: list[StepRecord]  # steps since the newest published bundle: the next one keeps them
    _policy_written: asyncio.Event  # set once the save in flight's trainers wrote their copy

    def _trace(self, **event: Any) -> None:
        raise NotImplementedError  # the controller's

    def _save_due(self, step: int) -> bool:
        return step % self.cfg.checkpoint.save_period == 0 or step == self.cfg.run.max_steps

    async def _start_save(self, *, emergency: bool = False) -> None:
        """Cut a bundle of the current step (``emergency``: on a stop request); returns once its window closed (or
        the save already ended).

        Pre: called from the train pump only. Post: the previous save has finished and been reported; the new
        one's policy, loader place and captured rows are fixed, the rest runs in ``self._pending_save``."""
        await self._collect_save(wait=True)
        released = asyncio.Event()
        self._policy_written = asyncio.Event()
        task = asyncio.create_task(self._save_or_report(self.step, released, emergency))
        self._pending_save = (self.step, task)
        await self._until(released, task)

    async def _emergency_save(self, deadline: float | None) -> bool:
        """On a stop request: a bundle of the step reached, started only when the recent saves say it finishes
        before ``deadline`` (``time.time()``; ``sc_app.checkpoint.emergency``). Returns True when it was skipped."""
        left = float("inf") if deadline is None else deadline - time.time()
        newest = f"step_{self._last_saved}" if self._last_saved else None
        plan = plan_emergency(self._save_seconds, left, newest_bundle=newest)
        self._progress.append(StopRecord(self.step, plan.line))
        if plan.start:
            await self._start_save(emergency=True)
            await self._collect_save(wait=True)
        return not plan.start

    async def _before_new_capture(self) -> None:
        """Before the trainers replace their state copy: the save in flight wrote the copy it captured (or ended)."""
        if self._pending_save is not None:
            await self._until(self._policy_written, self._pending_save[1])

    @staticmethod
    async def _until(event: asyncio.Event, task: asyncio.Task[Any]) -> None:
        """Until ``event`` is set or ``task`` ended, whichever comes first."""
        waiter = asyncio.ensure_future(event.wait())
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
            self._save_seconds = [*self._save_seconds, outcome.seconds][-8:]
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
            executor=self._save_io,
        )
        self._trace(ev="save", step=captured.step, digest=captured.digest, groups=captured.groups)
        return SaveRecord(
            step=captured.step,
            bundle=published.path.name,
            seconds=time.perf_counter() - t0,
            paused_seconds=paused,
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
                fencing_epoch=lease.fencing_epoch if lease is not None else 0,
                weights_version=self.version,
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
        finally:
            self._policy_written.set()  # the trainers may take a new copy (``_before_new_capture``)
        return {name: record for files in written for name, record in files.items()}
