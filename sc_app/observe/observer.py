"""JobObserver: what the driver calls to watch one attempt — run log, TensorBoard and metrics behind one surface.

The driver owns the only copy of everything worth recording (the resume plan, the lease, every progress record,
the exit code) and is not the train pump, so it is where records are made. Order of an attempt, each call fed by
one of ``run_job``'s callbacks or by ``cmd_run``:

    obs = JobObserver(ObserveOptions.of(cfg))            # nothing opened yet
    obs.started(run_id, lease, plan)                     # run log opened: start, lease taken, quarantine, resume
    obs.ray_ready()                                      # metrics attached (the resume replayed), keepalive thread
    obs.progress(record)                                 # every controller progress record, in order
    obs.finish(code, message)                            # always, whatever the exit: lease lost, exit

None of these block on the log volume (see ``runlog``); metrics are in-process calls into Ray's recorder. A
background thread keeps the metrics' gauges alive and counts run-log records lost on a slow volume (``tick``).
"""

from __future__ import annotations

import logging
import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sc_app.checkpoint.lease import Lease, read_lease
from sc_app.checkpoint.resume import ResumePlan
from sc_app.exits import EXIT_SUPERSEDED
from sc_app.observe.goodput import Ledger, ledger
from sc_app.observe.reader import RunHistory, RunLogMissing, read_history
from sc_app.observe.records import DEFAULT_LOG_SUBDIR, Event, LoggedEvent, LoggedStep, Stamp, StepMetrics
from sc_app.observe.recovered_steps import unlogged_steps
from sc_app.observe.runlog import CloseResult, RunLogOptions, RunLogWriter
from sc_app.progress import (
    FaultRecord,
    ProgressRecord,
    SaveFailedRecord,
    SaveRecord,
    StepRecord,
    StopRecord,
    UploadRecord,
)

if TYPE_CHECKING:
    from sc_app.config.app import AppConfig

log = logging.getLogger(__name__)

TICK_SECONDS = 1.0  # how often the keepalive thread looks (``JobMetrics.tick`` re-records at its own pace)
GOODPUT_GAUGE_S = 30.0  # how often the keepalive thread recomputes the goodput gauge from the attempt's records


class MetricsSink(Protocol):
    """What the observer needs from ``metrics.JobMetrics``."""

    def step(self, rec: StepMetrics, commit_waits: Sequence[float] = ()) -> None: ...
    def event(self, ev: Event, *, at: float | None = None) -> None: ...
    def dropped(self, n: int) -> None: ...
    def tick(self) -> None: ...


def run_log_dir(cfg: AppConfig) -> Path:
    """``run.log_dir``, or ``<checkpoint.dir>/logs`` when unset."""
    return Path(cfg.run.log_dir) if cfg.run.log_dir else Path(cfg.checkpoint.dir) / DEFAULT_LOG_SUBDIR


@dataclass(frozen=True)
class ObserveOptions:
    log_dir: Path | None  # None: no run log (and no TensorBoard files)
    log_buffer: int = 10_000  # records held while the log volume is slower than training
    tensorboard: bool = True
    metrics: bool = True  # record Prometheus metrics once Ray is up
    max_steps: int = 0  # what the start event says about the run
    save_period: int = 0
    preemption_notice_s: float | None = None  # checkpoint.preemption_notice_s: saves slower than it are warned about
    close_timeout_s: float = 10.0  # how long the exit waits for a slow volume before giving up on the rest

    @classmethod
    def of(cls, cfg: AppConfig) -> ObserveOptions:
        return cls(
            log_dir=run_log_dir(cfg) if cfg.run.log_enabled else None,
            log_buffer=cfg.run.log_buffer,
            tensorboard=cfg.run.tensorboard,
            metrics=cfg.run.metrics_enabled,
            max_steps=cfg.run.max_steps,
            save_period=cfg.checkpoint.save_period,
            preemption_notice_s=cfg.checkpoint.preemption_notice_s,
        )


def translate(record: ProgressRecord) -> tuple[StepMetrics | None, list[Event]]:
    """A controller progress record → the run log's step figures and events. Pure."""
    if isinstance(record, StepRecord):
        return StepMetrics.of(record), []
    if isinstance(record, SaveRecord):
        data = {
            "bundle": record.bundle,
            "seconds": record.seconds,
            "paused_seconds": record.paused_seconds,
            "window_seconds": record.window_seconds,
            "bytes": record.data_plane_bytes,
            "groups": record.groups,
        }
        if record.on_bucket:  # committed on the bucket alone (checkpoint.remote.parts=direct)
            data["on_bucket"] = True
        save = Event("emergency_save" if record.emergency else "save", record.step, data)
        pruned = [Event("prune", record.step, {"removed": list(record.pruned)})] if record.pruned else []
        return None, [save, *pruned]
    if isinstance(record, SaveFailedRecord):
        data = {"error": record.error, "in_a_row": record.in_a_row, "last_saved_step": record.last_saved_step}
        return None, [Event("save_failed", record.step, data)]
    if isinstance(record, StopRecord):
        return None, [Event("stop_requested", record.step, {"emergency": record.emergency} if record.emergency else {})]
    if isinstance(record, FaultRecord):
        return None, [fault_event(record)]
    if isinstance(record, UploadRecord):
        data = {"bundle": record.bundle, "bytes": record.bytes, "seconds": record.seconds}
        data["lag_steps"] = record.lag_steps
        if record.error:
            return None, [Event("upload_failed", record.step, {**data, "error": record.error})]
        return None, [Event("upload", record.step, data)]
    raise TypeError(f"not a progress record: {record!r}")


def fault_event(record: FaultRecord) -> Event:
    """The run log's ``fault`` event: what failed, how it ended and what it cost."""
    data = {
        "fault": record.kind,
        "outcome": record.outcome,
        "attempts": record.attempts,
        "detection_s": record.detection_seconds,
        "recovery_s": record.recovery_seconds,
        "rows_removed": record.rows_removed,
        "steps_redone": record.steps_redone,
        "rollouts_regenerated": record.rollouts_regenerated,
        "prompts_lost": record.prompts_lost,
        "prompts_duplicated": record.prompts_duplicated,
        "error": record.error,
    }
    if record.restored_step is not None:
        data["restored_step"] = record.restored_step
    if record.path:
        data.update(
            path=record.path,
            restarted=list(record.restarted),
            reset=list(record.reset),
            phase_s=dict(record.phase_seconds),
            stale_refused=record.stale_refused,
        )
    return Event("fault", record.step, data)


class JobObserver:
    """One attempt's run log + metrics. Every method is safe to call in any state: before ``started`` (nothing is
    recorded), with the log or the metrics switched off, after ``finish``."""

    def __init__(self, opts: ObserveOptions) -> None:
        self.opts = opts
        self.writer: RunLogWriter | None = None
        self.metrics: MetricsSink | None = None
        self.run_id: str | None = None
        self.attempt = 0
        self.last_step: int | None = None  # the newest step this attempt trained (or resumed from)
        self._replay: list[Event] = []  # events metrics must see once attached (the resume happened before Ray)
        self._dropped_seen = 0
        self._failure = ""  # the one-line error the attempt ends with, for its exit event
        self._closed = False
        self._stop_ticking = threading.Event()
        self._ticker: threading.Thread | None = None
        self._seen = RunHistory(Path("<this attempt>"))  # this attempt's records, for its goodput (ledger)
        self._goodput_at = 0.0  # monotonic time the goodput gauge was last computed

    # ------------------------------------------------------------------ before Ray
    def started(self, run_id: str, lease: Lease | None, plan: ResumePlan) -> JobObserver:
        """Open the attempt's run log and record how it starts: start, lease taken, quarantine, resume."""
        if self.run_id is not None or self._closed:
            return self
        self.run_id = run_id
        self.attempt = lease.fencing_epoch if lease is not None else 0
        start_step = plan.step if plan.decision == "resume" else 0
        self.last_step = start_step
        if self.opts.log_dir is not None:
            self.writer = RunLogWriter(
                RunLogOptions(
                    Path(self.opts.log_dir),
                    run_id=run_id,
                    attempt=lease.fencing_epoch if lease is not None else None,
                    start_step=start_step,
                    capacity=self.opts.log_buffer,
                    tensorboard=self.opts.tensorboard,
                )
            ).start()
        start = {
            "decision": plan.decision,
            "reason": plan.reason,
            "max_steps": self.opts.max_steps,
            "save_period": self.opts.save_period,
        }
        if self.opts.preemption_notice_s is not None:
            start["preemption_notice_s"] = self.opts.preemption_notice_s
        self.event(Event("start", start_step, start))
        if lease is not None:
            record = read_lease(lease.root)
            previous = (record.previous if record is not None else None) or {}
            taken = {
                "epoch": lease.fencing_epoch,
                "previous_run_id": previous.get("run_id"),
                "previous_epoch": previous.get("epoch"),
            }
            self.event(Event("lease_taken", start_step, taken))
        if plan.quarantined:
            self.event(Event("quarantine", start_step, {"moved": list(plan.quarantined)}))
        if plan.decision == "resume" and plan.bundle is not None:
            resume = Event("resume", plan.step, {"bundle": plan.bundle.name, "reason": plan.reason})
            self.event(resume)
            self._replay.append(resume)
            self._recover(plan)
        return self

    def _recover(self, plan: ResumePlan) -> None:
        """Log the steps the kept bundles cover that no attempt logged (``recovered_steps``), one ``recovered``
        event per bundle they came from."""
        if self.writer is None:
            return
        try:
            logged = {s.step for s in read_history(self.opts.log_dir).steps}  # type: ignore[arg-type]
        except (OSError, RunLogMissing):
            logged = set()
        for found in unlogged_steps(plan, logged):
            for rec in found.steps:
                self.writer.step(rec)
            self.event(Event("recovered", plan.step, {"steps": [r.step for r in found.steps], "bundle": found.bundle}))

    # ------------------------------------------------------------------ once Ray is up
    def ray_ready(self) -> None:
        """Attach the job's metrics (Pre: Ray is initialised in this process) and start keeping them alive."""
        if not self.opts.metrics or self.run_id is None or self.metrics is not None or self._closed:
            return
        from sc_app.observe.metrics import JobMetrics  # imports ray.util.metrics

        self.attach_metrics(JobMetrics(self.run_id, self.attempt))
        self._ticker = threading.Thread(target=self._keepalive, name="observe-tick", daemon=True)
        self._ticker.start()

    def attach_metrics(self, metrics: MetricsSink) -> None:
        self.metrics = metrics
        for ev in self._replay:
            metrics.event(ev)
        self._replay.clear()

    def _keepalive(self) -> None:
        while not self._stop_ticking.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception:  # metrics are a convenience: never let them take the driver down
                log.exception("observe: keeping the metrics alive failed; they may age out of Ray's agent")
                return

    # ------------------------------------------------------------------ during the run
    def progress(self, record: ProgressRecord) -> str | None:
        """One controller progress record (from ``run_job``'s ``on_progress``); returns a line for the driver to
        print after the record's own: the attempt's goodput after each published bundle."""
        step, events = translate(record)
        if step is not None:
            self.step(step, record.commit_waits if isinstance(record, StepRecord) else ())
        for ev in events:
            self.event(ev)
        return self.goodput().line() if isinstance(record, SaveRecord) and self.run_id is not None else None

    def ran(self) -> bool:
        """The attempt took the lease or trained (a refused one did neither: it has no goodput to report)."""
        return bool(self._seen.steps) or any(e.name == "lease_taken" for e in self._seen.events)

    def goodput(self) -> Ledger:
        """Where this attempt's time went so far (``sc_app.observe.goodput``), from the records it logged."""
        seen = self._seen
        return ledger(RunHistory(seen.path, list(seen.steps), list(seen.events)))

    def step(self, rec: StepMetrics, commit_waits: Sequence[float] = ()) -> None:
        if self.run_id is None:
            return
        self.last_step = rec.step
        self._seen.steps.append(LoggedStep(Stamp(time.time(), self.run_id, self.attempt), rec, False))
        if self.writer is not None:
            self.writer.step(rec)
        if self.metrics is not None:
            self.metrics.step(rec, commit_waits)

    def event(self, ev: Event) -> None:
        if self.run_id is None:
            return
        if ev.name != "goodput":
            self._seen.events.append(LoggedEvent(Stamp(time.time(), self.run_id, self.attempt), ev))
        if self.writer is not None:
            self.writer.event(ev)
        if self.metrics is not None:
            self.metrics.event(ev)

    def tick(self) -> None:
        """Keep gauges alive, report newly dropped run-log records (the keepalive thread calls it)."""
        if self.metrics is None:
            return
        if self.writer is not None:
            total = self.writer.dropped.total
            if total > self._dropped_seen:
                self.metrics.dropped(total - self._dropped_seen)
                self._dropped_seen = total
        if self.run_id is not None and not self._closed and time.monotonic() - self._goodput_at >= GOODPUT_GAUGE_S:
            self._goodput_at = time.monotonic()
            self.metrics.event(Event("goodput", self.last_step, {"goodput": self.goodput().goodput}))
        self.metrics.tick()

    # ------------------------------------------------------------------ the end
    def failed(self, message: str) -> None:
        """The error line the attempt is about to end with (its exit event carries it)."""
        self._failure = message

    def finish(self, code: int, message: str = "", final_step: int | None = None) -> CloseResult | None:
        """Log how the attempt ended — ``lease_lost`` when superseded, then ``exit`` (always queued, even on a full
        buffer) — and close the log. ``message`` defaults to the one noted by ``failed``; ``final_step`` to the
        newest step seen. Idempotent."""
        if self._closed:
            return None
        message = message or self._failure
        self._closed = True
        self._stop_ticking.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.run_id is None:
            return None
        step = self.last_step if final_step is None else final_step
        if self.ran():
            self.event(Event("goodput", step, self.goodput().as_event()))
        if code == EXIT_SUPERSEDED:
            self.event(Event("lease_lost", step, {"message": message}))
        self.tick()
        if self.writer is None:
            return None
        exit_ev = Event("exit", step, {"code": code, "message": message, "final_step": step})
        result = self.writer.close(self.opts.close_timeout_s, final=exit_ev)
        if result.dropped.total:
            log.warning(
                "run log %s: %d records lost on a slow volume (%s)",
                self.writer.path,
                result.dropped.total,
                result.dropped.as_dict(),
            )
        return result

    def where(self) -> str | None:
        """Where this attempt's run log is, for the job's last lines (None when the log is off)."""
        return str(self.writer.path) if self.writer is not None else None


def where_lines(cfg: AppConfig, observer: JobObserver) -> list[str]:
    """The job's last lines: where its run log is and the command that plots it (none when the log is off)."""
    path = observer.where()
    if path is None:
        return []
    ran = [observer.goodput().line()] if observer.ran() else []
    log_dir = Path(path).parent
    if cfg.run.log_dir:
        source = f"--log-dir {shlex.quote(str(log_dir))}"
    else:
        source = f"--checkpoint-dir {shlex.quote(cfg.checkpoint.dir)}"
    return [
        *ran,
        f"run log: {path} (TensorBoard: tensorboard --logdir {shlex.quote(str(log_dir))})",
        f"plots and summary: sc-app report {source}",
    ]
