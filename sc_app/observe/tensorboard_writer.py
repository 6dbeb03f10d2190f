"""TensorBoard scalars for the run log: the same figures as ``metrics.jsonl``, in event files beside it.

Written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package provides the format, the
reader and the viewer: ``tensorboard --logdir <log_dir>``). Each attempt writes its own event file into the same
directory; an attempt that trains steps an earlier attempt already logged opens its writer with
``purge_step = first redone step``, so TensorBoard drops the older attempt's points from there on and shows every
step once — the same rule as the ``redone`` mark in ``metrics.jsonl``.

Only ``TensorBoardFeed``'s thread calls ``ScalarWriter`` (never the driver's loop, never the run-log thread): the
JSONL lines are never held behind TensorBoard's import (seconds of CPU, more than a step's time on a loaded node).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

from sc_app.io.background import lower_current_thread_priority
from sc_app.observe.records import SAVE_EVENTS, LoggedEvent, LoggedStep

log = logging.getLogger(__name__)

# metrics.jsonl field -> TensorBoard tag
STEP_TAGS = {
    "reward_mean": "train/reward_mean",
    "reward_min": "train/reward_min",
    "reward_max": "train/reward_max",
    "loss": "train/loss",
    "staleness": "train/staleness",
    "rows_held": "train/rows_in_tq",
    "step_seconds": "train/step_seconds",
    "weights_version": "train/weights_version",
    "commit_wait_p99_s": "train/commit_wait_p99_seconds",
}
SAVE_TAGS = {
    "seconds": "save/seconds",
    "paused_seconds": "save/paused_seconds",
    "window_seconds": "save/window_seconds",
    "bytes": "save/bundle_bytes",
}
ATTEMPT_TAG = "run/attempt"  # one point per attempt, at the step it started from: where resumes happened


class ScalarWriter:
    """A ``SummaryWriter`` for one attempt. ``purge_step``: the first step this attempt logs again (or None)."""

    def __init__(self, log_dir: Path, *, purge_step: int | None, flush_secs: int = 5) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only in the run-log thread

        self._w: Any = SummaryWriter(str(log_dir), purge_step=purge_step, flush_secs=flush_secs)

    def step(self, logged: LoggedStep) -> None:
        rec, t = logged.record, logged.stamp.t
        for name, tag in STEP_TAGS.items():
            value = getattr(rec, name)
            if value is not None:
                self._w.add_scalar(tag, float(value), rec.step, walltime=t)

    def event(self, logged: LoggedEvent) -> None:
        step, t = logged.step, logged.stamp.t
        if step is None:
            return
        if logged.name in SAVE_EVENTS:
            for name, tag in SAVE_TAGS.items():
                value = logged.data.get(name)
                if isinstance(value, int | float):
                    self._w.add_scalar(tag, float(value), step, walltime=t)
        elif logged.name == "start":
            self._w.add_scalar(ATTEMPT_TAG, float(logged.stamp.attempt), step, walltime=t)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class TensorBoardFeed:
    """TensorBoard points in a thread of their own, fed by the run-log thread after each batch's JSONL lines.

    Invariants: ``put`` never blocks (a SIGKILL while TensorBoard imports loses points, never a ``metrics.jsonl``
    line); the writer is made at the first step (an attempt that trains none never imports it), events before it
    wait for it; at most ``capacity`` points wait, newer ones are dropped and counted (``dropped``); a writer that
    fails is closed and the feed drops what follows — TensorBoard never stops the JSONL log."""

    def __init__(self, log_dir: Path, *, capacity: int) -> None:
        self.log_dir = Path(log_dir)
        self.capacity = capacity
        self.dropped = 0
        self._purge_step: int | None = None
        self._cond = threading.Condition()
        self._queue: deque[LoggedStep | LoggedEvent] = deque()
        self._closing = False
        self._thread: threading.Thread | None = None

    def put(self, items: list[LoggedStep | LoggedEvent], *, purge_step: int | None) -> None:
        """Queue ``items``; ``purge_step``: the first step this attempt logs again (read at the writer's making)."""
        with self._cond:
            if self._closing:
                return
            room = max(0, self.capacity - len(self._queue))
            self.dropped += max(0, len(items) - room)
            self._queue.extend(items[:room])
            self._purge_step = purge_step
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="run-log-tensorboard", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float) -> bool:
        """Write what is queued and close the event file; False when that took longer than ``timeout``."""
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _run(self) -> None:
        lower_current_thread_priority()
        held: list[LoggedStep | LoggedEvent] = []
        writer: ScalarWriter | None = None
        broken = False
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: bool(self._queue) or self._closing)
                    items = list(self._queue)
                    self._queue.clear()
                    closing, purge_step = self._closing, self._purge_step
                if not broken:
                    held.extend(items)
                    if writer is None and any(isinstance(item, LoggedStep) for item in held):
                        writer = self._make(purge_step)
                        broken = writer is None
                    if writer is not None:
                        items, held = held, []
                        writer, broken = self._write(writer, items)
                if closing:
                    with self._cond:
                        if not self._queue:
                            return
        finally:
            if writer is not None:
                with contextlib.suppress(Exception):
                    writer.close()

    def _make(self, purge_step: int | None) -> ScalarWriter | None:
        try:
            return ScalarWriter(self.log_dir, purge_step=purge_step)
        except Exception as exc:  # TensorBoard is a convenience: the JSONL log goes on without it
            log.warning("run log %s: TensorBoard files disabled (%s: %s)", self.log_dir, type(exc).__name__, exc)
            return None

    def _write(self, writer: ScalarWriter, items: list[LoggedStep | LoggedEvent]) -> tuple[ScalarWriter | None, bool]:
        try:
            for item in items:
                if isinstance(item, LoggedStep):
                    writer.step(item)
                else:
                    writer.event(item)
            if items:
                writer.flush()  # a SIGKILL loses only the points still queued
            return writer, False
        except Exception as exc:  # a broken event file must not stop the JSONL log
            log.warning("run log %s: TensorBoard writing stopped (%s: %s)", self.log_dir, type(exc).__name__, exc)
            with contextlib.suppress(Exception):
                writer.close()
            return None, True
