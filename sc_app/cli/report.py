"""``sc-app report``: plots (PNG) and a Markdown summary from a run's log, without a cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

from sc_app.cli.options import add_checkpoint_dir, add_json
from sc_app.exits import EXIT_OK, fail


def register(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser(
        "report",
        help="plots (PNG) and a Markdown summary from the run log",
        description="Read the run log (metrics.jsonl, every attempt) and write reward/loss, step-time and save "
        "plots plus report.md. Needs no cluster.",
    )
    src = rp.add_mutually_exclusive_group(required=True)
    add_checkpoint_dir(src, required=False, help="the run's checkpoint.dir (its log is DIR/logs)")
    src.add_argument("--log-dir", metavar="DIR", help="the run's run.log_dir, when it was set")
    rp.add_argument("--out", metavar="DIR", help="where to write (default: <log dir>/report)")
    add_json(rp, help="print the summary as JSON")
    rp.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    from sc_app.observe.reader import RunLogMissing, read_history
    from sc_app.observe.records import DEFAULT_LOG_SUBDIR
    from sc_app.observe.report import summary_json, write_report

    log_dir = Path(args.log_dir) if args.log_dir else Path(args.checkpoint_dir) / DEFAULT_LOG_SUBDIR
    try:
        history = read_history(log_dir)
    except RunLogMissing as exc:
        hint = "" if args.log_dir else " (for a run with its own run.log_dir pass --log-dir DIR)"
        return fail(f"{exc}: nothing to report; run `sc-app run` on this checkpoint dir first{hint}")
    except OSError as exc:
        return fail(f"cannot read the run log in {log_dir}: {exc.strerror or exc}; check the path and permissions")
    if not history.steps and not history.events and history.skipped:
        return fail(f"{history.path} holds no run-log record ({history.skipped} unreadable lines); is it a run log?")
    out = Path(args.out) if args.out else log_dir / "report"
    try:
        summary = write_report(history, out)
    except OSError as exc:
        return fail(f"cannot write the report into {out}: {exc.strerror or exc}; pass a writable --out DIR")
    if args.json:
        print(summary_json(summary))
        return EXIT_OK
    print(
        f"steps {summary.first_step} -> {summary.last_step} over {len(summary.attempts)} attempt(s), "
        f"{summary.redone_lines} redone, {len(summary.missing_steps)} missing; {summary.saves} bundles published"
    )
    for name, path in summary.files.items():
        print(f"wrote {name}: {path}")
    return EXIT_OK
