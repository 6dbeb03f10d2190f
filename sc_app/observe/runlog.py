"""The run-log writer: the driver hands it records, one background thread appends them to ``metrics.jsonl``.

Invariants:
* ``step()`` / ``event()`` never block on I/O: they append to an in-memory buffer under a lock the writer thread
  holds only to take the buffer, never while writing. A full buffer drops the new record and counts it
  (``dropped``); steps may fill ``capacity`` records, events ``capacity + EVENT_RESERVE`` — so while a slow volume
  drops steps, the rarer events (saves, resumes, exit) are still kept. The next line written after a drop is a
  ``dropped`` event that says how many of each kind were lost since the previous one; the ``exit`` event carries
  the totals (``close(final=exit_event)`` queues it whatever the buffer holds). A write that fails (full disk, I/O
  error) loses that batch, is counted the same way, and the writer tries again with the next batch: the log never
  stops the job.
* A resumed attempt appends to the same file. Lines are whole: a line torn by a SIGKILL is closed with a newline
  before anything is appended, so it stays one unreadable line that readers skip.
* A step is marked ``redone`` when an earlier attempt already trained it (``Prior.high_water``: the highest step in
  the log before this attempt — a torn line counts — found by reading the file backwards to the previous ``start``
  event, which records the high-water mark before it). The same rule purges the older points in TensorBoard.
* Everything touching ``metrics.jsonl`` runs in the writer thread, at background priority: opening, scanning,
  writing, fsync (every ``fsync_interval_s`` and at close). It hands each written batch to ``TensorBoardFeed``
  (a thread of its own) and never waits for it: TensorBoard's import never holds a JSONL line back, so a SIGKILL
  loses only the records the volume had not taken yet. ``close(timeout)`` waits at most ``timeout`` for both and
  reports what was still unwritten.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sc_app.io.background import lower_current_thread_priority
from sc_app.observe.records import (
    LOG_FILE,
    Event,
    LoggedEvent,
    LoggedStep,
    Stamp,
    StepMetrics,
    encode_event,
    encode_step,
)
from sc_app.observe.runlog_file import Prior, close_torn_line, scan_prior
from sc_app.observe.tensorboard_writer import TensorBoardFeed

log = logging.getLogger(__name__)

EVENT_RESERVE = 256  # buffer slots only events may use


@dataclass(frozen=True)
class RunLogOptions:
    log_dir: Path
    run_id: str
    attempt: int | None  # the lease epoch; None (no lease, checkpoints off): one more than the log's last attempt
    start_step: int  # the step this attempt trains from (the resumed bundle's step, 0 when fresh)
    capacity: int = 10_000  # records held while the volume is slower than training
    tensorboard: bool = True
    fsync_interval_s: float = 5.0


@dataclass
class Dropped:
    steps: int = 0
    events: int = 0
    write_failed: int = 0  # records in batches whose write failed

    @property
    def total(self) -> int:
        return self.steps + self.events + self.write_failed

    def as_dict(self) -> dict[str, int]:
        return {"steps": self.steps, "events": self.events, "write_failed": self.write_failed}

    def copy(self) -> Dropped:
        return Dropped(self.steps, self.events, self.write_failed)

    def minus(self, other: Dropped) -> Dropped:
        return Dropped(self.steps - other.steps, self.events - other.events, self.write_failed - other.write_failed)


@dataclass(frozen=True)
class CloseResult:
    written: int  # lines written by this attempt (records + dropped-notes)
    dropped: Dropped
    unwritten: int  # records still buffered when close() gave up waiting (a hung volume)


def _fsync(fh: TextIO) -> None:
    """Best effort: the lines are already with the kernel (a killed process loses none of them); fsync only
    narrows what a node crash can lose, so a failing or meaningless one (a pipe) is logged, not counted."""
    try:
        os.fsync(fh.fileno())
    except OSError as exc:
        log.debug("run log: fsync failed: %s", exc)


@dataclass
class _Pending:
    kind: str  # "step" | "event"
    t: float
    item: StepMetrics | Event


@dataclass
class _State:
    buf: deque[_Pending] = field(default_factory=deque)
    dropped: Dropped = field(default_factory=Dropped)
    closing: bool = False
    busy: int = 0  # records taken from the buffer and not yet written (or given up)


class RunLogWriter:
    """One attempt's writer. ``start()`` it, feed it with ``step()``/``event()``, ``close()`` it at the end."""

    def __init__(self, opts: RunLogOptions) -> None:
        if opts.capacity < 1:
            raise ValueError("run-log capacity must be >= 1")
        self.opts = opts
        self.path = Path(opts.log_dir) / LOG_FILE
        self._cond = threading.Condition()
        self._s = _State()
        self._tb = TensorBoardFeed(opts.log_dir, capacity=opts.capacity) if opts.tensorboard else None
        self._thread = threading.Thread(target=self._run, name="run-log", daemon=True)
        self._written = 0
        self.prior: Prior | None = None  # known once the thread opened the log

    # ------------------------------------------------------------------ caller side (never blocks on I/O)
    def start(self) -> RunLogWriter:
        self._thread.start()
        return self

    def step(self, rec: StepMetrics) -> bool:
        """Queue a train step; False when the buffer was full and it was dropped (and counted)."""
        return self._put(_Pending("step", time.time(), rec), self.opts.capacity)

    def event(self, ev: Event) -> bool:
        """Queue an event; False when even the events' reserve was full and it was dropped (and counted)."""
        return self._put(_Pending("event", time.time(), ev), self.opts.capacity + EVENT_RESERVE)

    def _put(self, p: _Pending, limit: int) -> bool:
        with self._cond:
            s = self._s
            if s.closing:
                return False
            if len(s.buf) >= limit:
                if p.kind == "step":
                    s.dropped.steps += 1
                else:
                    s.dropped.events += 1
                return False
            s.buf.append(p)
            self._cond.notify()
            return True

    @property
    def buffered(self) -> int:
        """Records waiting for the writer thread (not counting the batch it is writing)."""
        with self._cond:
            return len(self._s.buf)

    @property
    def dropped(self) -> Dropped:
        with self._cond:
            return self._s.dropped.copy()

    def close(self, timeout: float = 10.0, *, final: Event | None = None) -> CloseResult:
        """Write what is buffered, then ``final`` (the ``exit`` event: it is queued whatever the buffer holds), and
        close the files; waits at most ``timeout`` seconds for a slow volume."""
        with self._cond:
            if final is not None and not self._s.closing:
                self._s.buf.append(_Pending("event", time.time(), final))
            self._s.closing = True
            self._cond.notify()
        give_up = time.monotonic() + timeout
        if self._thread.is_alive():
            self._thread.join(timeout)
        if self._tb is not None and not self._tb.close(max(0.0, give_up - time.monotonic())):
            log.warning(
                "run log %s: TensorBoard files not closed after %.0fs; metrics.jsonl is complete", self.path, timeout
            )
        with self._cond:
            left = len(self._s.buf) + self._s.busy if self._thread.is_alive() else 0
            result = CloseResult(self._written, self._s.dropped.copy(), left)
        if left:
            log.warning(
                "run log %s: %d records still unwritten after %.0fs (the volume is not keeping up); they are lost",
                self.path,
                left,
                timeout,
            )
        return result

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        lower_current_thread_priority()
        fh: TextIO | None = None
        reported = Dropped()
        last_fsync = time.monotonic()
        warned = False
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: bool(self._s.buf) or self._s.closing)
                    batch = list(self._s.buf)
                    self._s.buf.clear()
                    self._s.busy = len(batch)
                    closing = self._s.closing
                    drops = self._s.dropped.minus(reported)
                    snapshot = self._s.dropped.copy()
                try:
                    if fh is None:
                        fh = self._open()
                    lines, logged = self._encode(batch, drops, snapshot)
                    fh.write("".join(lines))
                    fh.flush()
                    self._written += len(lines)
                    reported = snapshot
                    if time.monotonic() - last_fsync >= self.opts.fsync_interval_s or closing:
                        last_fsync = time.monotonic()
                        _fsync(fh)
                except OSError as exc:
                    with self._cond:
                        self._s.dropped.write_failed += len(batch)
                    if not warned:
                        log.warning("run log %s: write failed (%s); records are counted as lost", self.path, exc)
                        warned = True
                    if fh is not None:
                        with contextlib.suppress(OSError):
                            fh.close()
                    fh = None
                    logged = []
                if self._tb is not None and logged:
                    self._tb.put(logged, purge_step=self._purge_step())
                with self._cond:
                    self._s.busy = 0
                    if closing and not self._s.buf:
                        break
        finally:
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()

    def _open(self) -> TextIO:
        opts = self.opts
        Path(opts.log_dir).mkdir(parents=True, exist_ok=True)
        if self.prior is None:
            self.prior = scan_prior(self.path)
        close_torn_line(self.path)  # also after a failed write that may have cut a line
        # a FIFO here blocks only this thread, as a hung volume would: training never waits for the log (close()
        # gives up after its timeout and counts what it could not write)
        return open(self.path, "a", encoding="utf-8")

    def _purge_step(self) -> int | None:
        """The first step this attempt logs again (TensorBoard drops the older attempts' points from there)."""
        redo = self.prior is not None and self.prior.high_water > self.opts.start_step
        return self.opts.start_step + 1 if redo else None

    def _stamp(self, t: float) -> Stamp:
        assert self.prior is not None
        attempt = self.opts.attempt if self.opts.attempt is not None else self.prior.last_attempt + 1
        return Stamp(t=t, run_id=self.opts.run_id, attempt=attempt)

    def _encode(
        self, batch: list[_Pending], drops: Dropped, totals: Dropped
    ) -> tuple[list[str], list[LoggedStep | LoggedEvent]]:
        assert self.prior is not None
        lines: list[str] = []
        logged: list[LoggedStep | LoggedEvent] = []
        if drops.total > 0:
            note = Event(
                "dropped",
                data={
                    **drops.as_dict(),
                    "reason": f"buffer full (run.log_buffer={self.opts.capacity}) or write failed: "
                    "the log volume was slower than training",
                },
            )
            lines.append(encode_event(note, self._stamp(time.time())))
        for p in batch:
            stamp = self._stamp(p.t)
            if isinstance(p.item, StepMetrics):
                item = LoggedStep(stamp, p.item, redone=p.item.step <= self.prior.high_water)
                lines.append(encode_step(item.record, stamp, redone=item.redone))
            else:
                ev = p.item
                if ev.name == "start":
                    ev = Event(ev.name, ev.step, {**ev.data, "high_water": self.prior.high_water})
                elif ev.name == "exit":
                    ev = Event(ev.name, ev.step, {**ev.data, "dropped": totals.as_dict()})
                item = LoggedEvent(stamp, ev)
                lines.append(encode_event(ev, stamp))
            logged.append(item)
        return lines, logged
