"""``sc-app run``: train to ``run.max_steps`` (resuming the newest verified bundle) and say how the run ended.

What it prints is read by ``sc-app k8s status`` from the driver's log (``sc_app.k8s.driver_log``): the start line,
the plan, one progress line per step, and the end line. Exit codes: ``sc_app.exits`` for errors, ``_ended`` for how
a run that was not refused ended.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_app import __version__
from sc_app.cli.options import add_checkpoint_dir, add_config, resolve
from sc_app.config.app import AppConfig
from sc_app.exits import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, exit_for, fail

if TYPE_CHECKING:
    from sc_app.attempt.run import AttemptStarted, RunResult
    from sc_app.checkpoint import ResumePlan
    from sc_app.observe.library_logs import LibraryLogs
    from sc_app.observe.observer import JobObserver


def register(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser(
        "run",
        help="run the training job (embedded default when no config is given)",
        description="Train to run.max_steps, resuming from the newest verified step_N bundle in checkpoint.dir.",
        epilog="exit codes: 0 done; 1 the job failed; 2 bad input; 3 superseded by a newer run (fencing); "
        "143 stopped on SIGTERM after cutting a bundle of the current step (a retry resumes from it)",
    )
    add_config(run)
    add_checkpoint_dir(run, required=False, help="same as --set checkpoint.dir=DIR")
    run.add_argument("--max-steps", metavar="N", type=int, help="same as --set run.max_steps=N")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    cfg = resolve(args)
    logging.basicConfig(level=cfg.run.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sc_app.observe.library_logs import LibraryLogs
    from sc_app.observe.observer import JobObserver, ObserveOptions, where_lines

    observer = JobObserver(ObserveOptions.of(cfg))  # opens the run log once run_job reports the attempt
    libraries = LibraryLogs().install()  # Ray's, TransferQueue's, ... records: libraries.log, not the console
    code = EXIT_FAILED
    try:
        code = _run(cfg, observer, libraries)
        return code
    finally:
        libraries.close()
        in_flight = sys.exc_info()[1]  # e.g. KeyboardInterrupt, or a bug: the exit event still says what ended it
        observer.finish(code, f"{type(in_flight).__name__}: {in_flight}" if in_flight else "")
        for line in where_lines(cfg, observer):
            print(line, flush=True)


class StopOnSignal:
    """SIGTERM asks the run to stop after the current step and save; installed again once Ray is up (``ray.init``
    replaces the handler)."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.requested = True
        print(f"received {signal.Signals(signum).name}: stopping after the current step and saving", flush=True)


def print_plan(plan: ResumePlan) -> None:
    for moved in plan.quarantined:
        print(f"quarantined {moved}")
    if plan.decision == "resume":
        print(f"resuming from {plan.bundle} (step {plan.step}): {plan.reason}", flush=True)
    elif plan.decision == "fresh":
        print(f"starting fresh: {plan.reason}", flush=True)


def _run(cfg: AppConfig, observer: JobObserver, libraries: LibraryLogs) -> int:
    from sc_app.attempt.run import JobCallbacks, run_job
    from sc_app.checkpoint.emergency import progress_notes
    from sc_app.progress import ProgressRecord, format_line

    stop = StopOnSignal()
    stop.install()

    def on_progress(record: ProgressRecord) -> None:
        print(format_line(record, cfg.run.max_steps), flush=True)
        for note in progress_notes(record, cfg.checkpoint.preemption_notice_s):
            print(note, flush=True)
        if extra := observer.progress(record):  # the attempt's goodput after each bundle
            print(extra, flush=True)

    def on_ray_ready() -> None:
        stop.install()
        libraries.route_ray_errors()  # "(raylet) A worker died ..." lines: libraries.log, not the console
        observer.ray_ready()

    print(
        f"sc-app {__version__}: max_steps={cfg.run.max_steps} checkpoint.dir={cfg.checkpoint.dir} "
        f"save_period={cfg.checkpoint.save_period} ray={'embedded' if cfg.ray.address is None else cfg.ray.address}",
        flush=True,
    )
    calls = JobCallbacks(
        on_plan=print_plan,
        on_progress=on_progress,
        stop_requested=lambda: stop.requested,
        on_ray_ready=on_ray_ready,
        on_attempt=lambda a: _started(observer, libraries, a),
    )
    try:
        result = run_job(cfg, calls)
    except Exception as exc:
        ended = exit_for(exc)
        if ended is None:
            raise
        observer.failed(ended.message)
        return fail(ended.message, ended.code)
    return _ended(cfg, result, observer)


def _started(observer: JobObserver, libraries: LibraryLogs, attempt: AttemptStarted) -> None:
    """The attempt's run log opened, and the library log beside it (from the lease on: nothing is written into the
    checkpoint directory of a refused run)."""
    observer.started(attempt.run_id, attempt.lease, attempt.plan)
    if observer.opts.log_dir is not None:
        libraries.open(Path(observer.opts.log_dir))


def _ended(cfg: AppConfig, result: RunResult, observer: JobObserver) -> int:
    """Say how a run that was not refused ended; its exit code."""
    from sc_app.progress import RunSummary

    summary = result.summary
    if result.outcome == "already_done":
        print(f"done: step {summary.final_step} already reached run.max_steps={cfg.run.max_steps}; nothing to train")
        return EXIT_OK
    if result.outcome == "unsaved":
        newest = f"step_{summary.last_saved_step}" if summary.last_saved_step else "none"
        message = (
            f"trained to step {summary.final_step} but {summary.unsaved_steps} steps are not covered by a bundle "
            f"(saves failed; newest bundle: {newest}); free space on {cfg.checkpoint.dir} and rerun to resume"
        )
        observer.failed(message)
        return fail(message, EXIT_FAILED)
    if result.outcome == "stopped":
        if summary.final_step == result.plan.step:
            print(f"stopped on request at step {summary.final_step}: nothing trained since the newest bundle")
        elif summary.emergency_skipped:
            print(f"stopped on request at step {summary.final_step} without an emergency bundle (it would not have "
                  f"finished in time); a rerun resumes from "
                  + (f"step_{summary.last_saved_step}" if summary.last_saved_step else "the start"), flush=True)
        else:
            print(
                f"stopped: step {summary.final_step} saved on request after {result.seconds:.1f}s; "
                "a rerun resumes from it",
                flush=True,
            )
        return EXIT_STOPPED
    print(
        f"done: step {summary.final_step} in {result.seconds:.1f}s; mean reward "
        f"{RunSummary.mean(summary.first_rewards):.3f} (first steps) -> "
        f"{RunSummary.mean(summary.last_rewards):.3f} (last steps)",
        flush=True,
    )
    return EXIT_OK
