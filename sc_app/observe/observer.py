"""JobObserver: what the driver calls to watch one attempt — run log, TensorBoard and metrics behind one surface.

The driver owns the only copy of everything worth recording (the resume plan, the lease, every progress record,
the exit code) and is not the train pump, so it is where records are made. Order of a run:

    obs = JobObserver.open(opts, run_id=..., lease=..., plan=...)   # before Ray: start, lease, quarantine, resume
    obs.attach_metrics(JobMetrics(...))                              # once Ray is up (replays the resume)
    obs.step(rec, commit_waits) / obs.event(ev); obs.tick()          # from the driver's poll loop
    obs.finish(code, message, final_step)                            # always, whatever the exit

None of these block on the log volume (see ``runlog``); metrics are in-process calls into Ray's recorder.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sc_app.checkpoint.lease import Lease, read_lease
from sc_app.checkpoint.resume import ResumePlan
from sc_app.observe.records import Event, StepRecord
from sc_app.observe.runlog import CloseResult, RunLogOptions, RunLogWriter

log = logging.getLogger(__name__)


class MetricsSink(Protocol):
    """What the observer needs from ``metrics.JobMetrics``."""

    def step(self, rec: StepRecord, commit_waits: Sequence[float] = ()) -> None: ...
    def event(self, ev: Event, *, at: float | None = None) -> None: ...
    def dropped(self, n: int) -> None: ...
    def tick(self) -> None: ...


@dataclass(frozen=True)
class ObserveOptions:
    log_dir: Path | None  # None: no run log (and no TensorBoard files)
    log_buffer: int = 10_000  # records held while the log volume is slower than training
    tensorboard: bool = True
    close_timeout_s: float = 10.0  # how long the exit waits for a slow volume before giving up on the rest


class JobObserver:
    """One attempt's run log + metrics. Every method is safe to call with logging or metrics switched off."""

    def __init__(self, opts: ObserveOptions, writer: RunLogWriter | None) -> None:
        self.opts = opts
        self.writer = writer
        self.metrics: MetricsSink | None = None
        self._replay: list[Event] = []  # events metrics must see once attached (the resume happened before Ray)
        self._dropped_seen = 0
        self._closed = False

    @classmethod
    def open(
        cls,
        opts: ObserveOptions,
        *,
        run_id: str,
        lease: Lease | None,
        plan: ResumePlan,
        max_steps: int,
        save_period: int,
    ) -> JobObserver:
        """Start the attempt's run log and record how it starts: start, lease taken, quarantine, resume."""
        start_step = plan.step if plan.decision == "resume" else 0
        writer = None
        if opts.log_dir is not None:
            writer = RunLogWriter(
                RunLogOptions(
                    Path(opts.log_dir),
                    run_id=run_id,
                    attempt=lease.epoch if lease is not None else None,
                    start_step=start_step,
                    capacity=opts.log_buffer,
                    tensorboard=opts.tensorboard,
                )
            ).start()
        obs = cls(opts, writer)
        obs.event(
            Event(
                "start",
                start_step,
                {"decision": plan.decision, "reason": plan.reason, "max_steps": max_steps, "save_period": save_period},
            )
        )
        if lease is not None:
            previous = (read_lease(lease.root) or {}).get("previous") or {}
            obs.event(
                Event(
                    "lease_taken",
                    start_step,
                    {
                        "epoch": lease.epoch,
                        "previous_run_id": previous.get("run_id"),
                        "previous_epoch": previous.get("epoch"),
                    },
                )
            )
        if plan.quarantined:
            obs.event(Event("quarantine", start_step, {"moved": list(plan.quarantined)}))
        if plan.decision == "resume" and plan.bundle is not None:
            resume = Event("resume", plan.step, {"bundle": plan.bundle.name, "reason": plan.reason})
            obs.event(resume)
            obs._replay.append(resume)
        return obs

    # ------------------------------------------------------------------ during the run
    def attach_metrics(self, metrics: MetricsSink) -> None:
        self.metrics = metrics
        for ev in self._replay:
            metrics.event(ev)
        self._replay.clear()

    def step(self, rec: StepRecord, commit_waits: Sequence[float] = ()) -> None:
        if self.writer is not None:
            self.writer.step(rec)
        if self.metrics is not None:
            self.metrics.step(rec, commit_waits)

    def event(self, ev: Event) -> None:
        if self.writer is not None:
            self.writer.event(ev)
        if self.metrics is not None:
            self.metrics.event(ev)

    def tick(self) -> None:
        """From the driver's poll loop: keep gauges alive, report newly dropped run-log records."""
        if self.metrics is None:
            return
        if self.writer is not None:
            total = self.writer.dropped.total
            if total > self._dropped_seen:
                self.metrics.dropped(total - self._dropped_seen)
                self._dropped_seen = total
        self.metrics.tick()

    # ------------------------------------------------------------------ the end
    def finish(self, code: int, message: str = "", final_step: int | None = None) -> CloseResult | None:
        """Log the exit (always queued, even on a full buffer) and close the log. Idempotent."""
        if self._closed:
            return None
        self._closed = True
        self.tick()
        if self.writer is None:
            return None
        exit_ev = Event("exit", final_step, {"code": code, "message": message, "final_step": final_step})
        result = self.writer.close(self.opts.close_timeout_s, final=exit_ev)
        if result.dropped.total:
            log.warning(
                "run log %s: %d records lost on a slow volume (%s)",
                self.writer.path,
                result.dropped.total,
                result.dropped.as_dict(),
            )
        return result
