"""``sc-app``: run the job, check checkpoints before a driver starts, operate on bundles, and plot a run's log.

Exit codes: 0 ok; 1 the job failed; 2 bad input (config, flags, bundles that must not be resumed);
3 superseded by a newer run on the same checkpoint dir; 143 stopped on SIGTERM after the emergency checkpoint.
Every error is one line on stderr that names the problem and what to do.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_app import __version__
from sc_app.checkpoint.lease import LeaseError
from sc_app.checkpoint.lineage import LineageError, read_lineage
from sc_app.config import AppConfig, ConfigError, Override, dump_config, load_config
from sc_app.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_SUPERSEDED, fail

if TYPE_CHECKING:
    from sc_app.observe.observer import JobObserver

log = logging.getLogger("sc_app")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        self.exit(EXIT_BAD_INPUT, f"sc-app: error: {message} (see `{self.prog} --help`)\n")


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML config; the embedded default when omitted")
    p.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key, e.g. --set checkpoint.save_period=2 (repeatable)",
    )


def _resolve(args: argparse.Namespace) -> AppConfig:
    overrides: list[str | Override] = list(args.overrides)
    if getattr(args, "checkpoint_dir", None) is not None:
        overrides.append(Override(f"checkpoint.dir={args.checkpoint_dir}", f"--checkpoint-dir {args.checkpoint_dir}"))
    if getattr(args, "max_steps", None) is not None:
        overrides.append(Override(f"run.max_steps={args.max_steps}", f"--max-steps {args.max_steps}"))
    return load_config(args.config, overrides)


# ---------------------------------------------------------------------------------------------- run
def cmd_run(args: argparse.Namespace) -> int:
    cfg = _resolve(args)
    logging.basicConfig(level=cfg.run.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sc_app.observe.observer import JobObserver, ObserveOptions, where_lines

    observer = JobObserver(ObserveOptions.of(cfg))  # opens the run log once run_job reports the attempt
    code = EXIT_FAILED
    try:
        code = _run(cfg, observer)
        return code
    finally:
        in_flight = sys.exc_info()[1]  # e.g. KeyboardInterrupt, or a bug: the exit event still says what ended it
        observer.finish(code, f"{type(in_flight).__name__}: {in_flight}" if in_flight else "")
        for line in where_lines(cfg, observer):
            print(line, flush=True)


def _run(cfg: AppConfig, observer: JobObserver) -> int:
    from sc_app.checkpoint import ResumePlan
    from sc_app.checkpoint.lease import LeaseLost
    from sc_app.controller import InventoryMismatch, SaveFailed
    from sc_app.driver import ResumeRefused
    from sc_app.job import CheckpointDirUnusable, EmergencyTimeout, JobFailed, run_job
    from sc_app.policy.hf.errors import HFInputError
    from sc_app.progress import ProgressRecord, RunSummary, format_line

    stop = {"requested": False}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["requested"] = True
        print(f"received {signal.Signals(signum).name}: stopping after the current step and saving", flush=True)

    def install_handlers() -> None:
        signal.signal(signal.SIGTERM, on_signal)

    install_handlers()

    def on_plan(plan: ResumePlan) -> None:
        for moved in plan.quarantined:
            print(f"quarantined {moved}")
        if plan.decision == "resume":
            print(f"resuming from {plan.bundle} (step {plan.step}): {plan.reason}", flush=True)
        elif plan.decision == "fresh":
            print(f"starting fresh: {plan.reason}", flush=True)

    def on_progress(record: ProgressRecord) -> None:
        print(format_line(record, cfg.run.max_steps), flush=True)
        observer.progress(record)

    def on_ray_ready() -> None:
        install_handlers()
        observer.ray_ready()

    def failed(message: str, code: int = EXIT_BAD_INPUT) -> int:
        observer.failed(message)
        return fail(message, code)

    print(
        f"sc-app {__version__}: max_steps={cfg.run.max_steps} checkpoint.dir={cfg.checkpoint.dir} "
        f"save_period={cfg.checkpoint.save_period} ray={'embedded' if cfg.ray.address is None else cfg.ray.address}",
        flush=True,
    )
    try:
        result = run_job(
            cfg,
            on_plan=on_plan,
            on_progress=on_progress,
            stop_requested=lambda: stop["requested"],
            on_ray_ready=on_ray_ready,
            on_attempt=lambda a: observer.started(a.run_id, a.lease, a.plan),
        )
    except (ResumeRefused, CheckpointDirUnusable, LeaseError, LineageError, HFInputError) as exc:
        return failed(f"{exc}")
    except LeaseLost as exc:
        return failed(f"superseded: {exc}", EXIT_SUPERSEDED)
    except (SaveFailed, InventoryMismatch, EmergencyTimeout, JobFailed) as exc:
        return failed(str(exc), EXIT_FAILED)
    summary = result.summary
    if result.outcome == "already_done":
        print(f"done: step {summary.final_step} already reached run.max_steps={cfg.run.max_steps}; nothing to train")
        return EXIT_OK
    if result.outcome == "unsaved":
        newest = f"step_{summary.last_saved_step}" if summary.last_saved_step else "none"
        return failed(
            f"trained to step {summary.final_step} but {summary.unsaved_steps} steps are not covered by a bundle "
            f"(saves failed; newest bundle: {newest}); free space on {cfg.checkpoint.dir} and rerun to resume",
            EXIT_FAILED,
        )
    if result.outcome == "stopped":
        if summary.final_step == result.plan.step:
            print(f"stopped on request at step {summary.final_step}: nothing trained since the newest bundle")
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


# ---------------------------------------------------------------------------------------------- preflight
def _dataset_problem(cfg: AppConfig, plan: Any) -> str | None:
    """A jsonl run's dataset file against the bundle it would resume (see ``task.allow_changed_dataset``)."""
    if plan.decision != "resume" or cfg.task.name != "jsonl" or cfg.task.allow_changed_dataset:
        return None
    from sc_app.policy.hf.dataset import DatasetError, DatasetRecord, changed_dataset_problem, load_jsonl

    assert cfg.task.path is not None
    try:
        current = DatasetRecord.of(load_jsonl(cfg.task.path, shuffle=cfg.task.shuffle, seed=cfg.run.seed))
    except DatasetError as exc:
        return str(exc)
    manifest = plan.manifest
    return changed_dataset_problem(manifest.dataset if manifest else None, current, bundle=str(plan.bundle))


def _checkpoint_root(args: argparse.Namespace, *, must_exist: bool) -> Path:
    """``--checkpoint-dir`` as a directory that can be read, else ``_BadDir`` with the one line to print."""
    from sc_app.checkpoint import volume

    root = Path(args.checkpoint_dir)
    problem = volume.unusable_as_dir(root)
    if problem is None and must_exist and not root.exists():
        problem = f"checkpoint dir {root} does not exist"
    if problem:
        raise _BadDir(problem)
    return root


class _BadDir(Exception):
    """A ``--checkpoint-dir`` a command cannot use; the message is its one error line."""


def cmd_preflight(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import ResumePlan, hmac_key_from_env, plan_resume, volume
    from sc_app.checkpoint.compat import compat_of
    from sc_app.checkpoint.lease import dir_lock, live_holder

    root = _checkpoint_root(args, must_exist=False)
    cfg = _resolve(args) if (args.config or args.overrides) else None
    policy = args.on_corrupt or (cfg.checkpoint.on_corrupt if cfg else "fallback")
    holder = live_holder(root) if root.is_dir() else None
    why_read_only = None
    if args.dry_run:
        why_read_only = "--dry-run"
    elif holder is not None:
        why_read_only = (
            f"run {holder.run_id} (epoch {holder.epoch}, {holder.host}) holds a live lease on {root}; only the lease "
            "holder moves anything there (the next run tidies after taking the lease)"
        )
    elif root.is_dir() and (problem := volume.unwritable(root)):
        why_read_only = problem

    lineage = read_lineage(root) if root.is_dir() else None

    def decide(tidy: bool) -> Any:
        return plan_resume(
            root,
            policy=policy,
            hmac_key=hmac_key_from_env(),
            expected_compat=compat_of(cfg) if cfg else None,
            tidy=tidy,
            expected_lineage=lineage,
        )

    if why_read_only is None and root.is_dir():
        with dir_lock(root):  # a writer taking the lease now waits, so nothing of a live save is moved
            plan = decide(tidy=live_holder(root) is None)
    else:
        plan = decide(tidy=False)
    dataset_problem = _dataset_problem(cfg, plan) if cfg is not None else None
    if dataset_problem:
        plan = ResumePlan("refuse", dataset_problem, plan.bundle, plan.step, plan.reports, plan.quarantined)
    if args.json:
        print(json.dumps({**plan.as_dict(), "moved_nothing_because": why_read_only}, indent=2))
    else:
        for r in plan.reports:
            state = "ok" if r.ok else "BAD: " + "; ".join(r.problems)
            print(f"checked {r.name}: {state}")
        for moved in plan.quarantined:
            print(f"quarantined {moved}")
        if why_read_only and why_read_only != "--dry-run":
            print(f"moved nothing: {why_read_only}")
        where = f" {plan.bundle.name} (step {plan.step})" if plan.bundle else ""
        print(f"decision: {plan.decision}{where}: {plan.reason}")
    return EXIT_OK if plan.ok else EXIT_BAD_INPUT


# ---------------------------------------------------------------------------------------------- stop
def cmd_stop(args: argparse.Namespace) -> int:
    """Ask the run holding the directory's lease to stop gracefully; optionally wait until it did."""
    import time

    from sc_app.checkpoint.lease import read_lease
    from sc_app.checkpoint.stop_request import request_stop

    if args.wait < 0:
        return fail("--wait must be >= 0 seconds")
    root = _checkpoint_root(args, must_exist=True)
    holder = read_lease(root)
    if holder is None or not holder.live():
        state = "no lease" if holder is None else ("released" if holder.released else "an expired lease")
        print(f"no run is writing to {root} ({state}): nothing to stop")
        return EXIT_OK
    try:
        request_stop(root, holder)
    except OSError as exc:
        return fail(f"cannot write the stop request to {root} ({exc.strerror or exc}); is the volume read-only?")
    print(
        f"asked run {holder.run_id} (epoch {holder.epoch}, {holder.host}) to stop: it finishes its step, saves a "
        "bundle of it and exits",
        flush=True,
    )
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        current = read_lease(root)
        if current is None or (current.run_id, current.epoch) != (holder.run_id, holder.epoch):
            print(f"run {holder.run_id} was superseded by run {current.run_id if current else None}")
            return EXIT_OK
        if current.released is not None:
            rel = current.released
            print(
                f"stopped: run {holder.run_id} ended ({rel.outcome}) at step {rel.final_step}; newest bundle "
                f"{rel.newest_bundle}"
            )
            return EXIT_OK
        if not current.live():
            print(f"run {holder.run_id} is gone: its lease expired without a release (killed?)")
            return EXIT_OK
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if args.wait == 0:
        return EXIT_OK
    return fail(f"run {holder.run_id} was still running after --wait {args.wait:g}s", EXIT_FAILED)


# ---------------------------------------------------------------------------------------------- ckpt
def cmd_ckpt_list(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import hmac_key_from_env, layout, verify_bundle

    root = _checkpoint_root(args, must_exist=True)
    try:
        entries, leftover_dirs = layout.step_entries(root), layout.tmp_dirs(root)
    except OSError as exc:
        return fail(f"cannot list --checkpoint-dir {root}: {exc.strerror or exc}")
    lineage = read_lineage(root)
    rows = [
        verify_bundle(p, deep=False, hmac_key=hmac_key_from_env(), expected_lineage=lineage).as_dict()
        for _, p in entries
    ]
    leftovers = [p.name for p in leftover_dirs]
    if args.json:
        print(json.dumps({"bundles": rows, "incomplete": leftovers}, indent=2))
        return EXIT_OK
    if not rows and not leftovers:
        print(f"no bundles in {root}")
    for r in rows:
        print(
            f"{r['name']:<14} step {r['step']:>6}  {'ok ' if r['ok'] else 'BAD'}  "
            f"{(r['bytes'] or 0) / 2**20:8.2f} MiB  groups {r['groups']}  {r['created_at'] or ''}"
        )
    for name in leftovers:
        print(f"{name:<14} incomplete (never resumed; preflight moves it to quarantine/)")
    return EXIT_OK


def cmd_ckpt_verify(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import hmac_key_from_env, layout, verify_bundle

    root = _checkpoint_root(args, must_exist=True)
    not_names = [b for b in args.bundle if layout.parse_step(b) is None]
    if not_names:
        return fail(f"{not_names[0]!r} is not a bundle name: name bundles step_N, as `sc-app ckpt list` shows them")
    named = [root / b for b in args.bundle]
    absent = [p.name for p in named if not (p.exists() or p.is_symlink())]
    if absent:
        return fail(f"no bundle named {', '.join(absent)} in {root} (see `sc-app ckpt list`)")
    try:
        targets = named or [p for _, p in layout.step_entries(root)]
    except OSError as exc:
        return fail(f"cannot list --checkpoint-dir {root}: {exc.strerror or exc}")
    if not targets:
        return fail(f"no step_N bundle in {root}")
    lineage = read_lineage(root)
    reports = [verify_bundle(p, hmac_key=hmac_key_from_env(), expected_lineage=lineage) for p in targets]
    # a bundle the live writer's retention removed while it was being read is gone, not bad
    gone = {r.name for r in reports if not r.ok and not (r.path.exists() or r.path.is_symlink())}
    if args.json:
        print(json.dumps([{**r.as_dict(), "gone": r.name in gone} for r in reports], indent=2))
    else:
        for r in reports:
            state = "verified" if r.ok else "BAD: " + "; ".join(r.problems)
            if r.manifest is not None:  # which algorithm the file digests were checked with
                state += f" ({r.manifest.hash_alg} file digests)"
            print(f"{r.name}: " + ("gone: pruned by the writer while being checked" if r.name in gone else state))
            for note in r.notes:
                print(f"  note: {note}")
    return EXIT_OK if all(r.ok or r.name in gone for r in reports) else EXIT_BAD_INPUT


def cmd_ckpt_prune(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import hmac_key_from_env, prune
    from sc_app.checkpoint.lease import dir_lock, live_holder

    if args.keep < 1:
        return fail("--keep must be >= 1: the newest verified bundle is always kept")
    root = _checkpoint_root(args, must_exist=True)
    holder = live_holder(root)
    if holder is not None:
        return fail(
            f"run {holder.run_id} (epoch {holder.epoch}, {holder.host}) holds a live lease on {root}: while it runs "
            "only it prunes (checkpoint.keep); stop it first (`sc-app stop`)"
        )
    with dir_lock(root):
        if live_holder(root) is not None:
            return fail(f"a run took the lease of {root} just now; rerun when it has stopped")
        removed = prune(root, args.keep, hmac_key=hmac_key_from_env(), expected_lineage=read_lineage(root))
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        print("removed " + (", ".join(removed) if removed else "nothing"))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from sc_app.checkpoint import hmac_key_from_env, layout, verify_bundle

    root = _checkpoint_root(args, must_exist=True)
    key = hmac_key_from_env()
    if args.step is not None:
        bundle = root / layout.step_name(args.step)
        if not bundle.is_dir():
            return fail(f"no {bundle.name} in {root}; `sc-app ckpt list --checkpoint-dir {root}` shows the bundles")
        report = verify_bundle(bundle, hmac_key=key)
        if not report.ok:
            return fail(f"{bundle} does not verify ({report.problems[0]}); export another --step")
    else:
        report = None
        for _, candidate in layout.step_dirs(root):
            checked = verify_bundle(candidate, hmac_key=key)
            if checked.ok:
                report = checked
                break
            print(f"skipped {candidate.name}: {checked.problems[0]}")
        if report is None:
            return fail(f"no verified step_N bundle in {root}; `sc-app ckpt verify` names the problems")
        bundle = report.path
    assert report.manifest is not None
    backend = report.manifest.compat.get("model.backend", "tiny")
    if backend != "hf":
        return fail(
            f"{bundle.name} holds a model.backend={backend} policy: there is nothing to export in Hugging Face layout "
            "(export works on bundles of model.backend=hf runs)"
        )
    from sc_app.policy.hf.errors import HFInputError
    from sc_app.policy.hf.export import ExportError, export_policy
    from sc_app.policy.hf.policy_ckpt import PolicyIntegrityError

    try:
        result = export_policy(bundle / layout.POLICY_DIR, report.manifest.hashes_under(layout.POLICY_DIR), args.out)
    except (ExportError, PolicyIntegrityError, HFInputError) as exc:
        return fail(str(exc))
    print(
        f"exported {bundle.name} (step {report.step}) to {result.out}: {result.parameters:,} parameters in "
        f"{result.dtype}, {len(result.files)} files; load it with AutoModelForCausalLM.from_pretrained"
    )
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- report
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


def cmd_config(args: argparse.Namespace) -> int:
    print(dump_config(_resolve(args)), end="")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sc-app", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"sc-app {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser(
        "run",
        help="run the training job (embedded default when no config is given)",
        description="Train to run.max_steps, resuming from the newest verified step_N bundle in checkpoint.dir.",
        epilog="exit codes: 0 done; 1 the job failed; 2 bad input; 3 superseded by a newer run (fencing); "
        "143 stopped on SIGTERM after cutting a bundle of the current step (a retry resumes from it)",
    )
    _config_args(run)
    run.add_argument("--checkpoint-dir", metavar="DIR", help="same as --set checkpoint.dir=DIR")
    run.add_argument("--max-steps", metavar="N", type=int, help="same as --set run.max_steps=N")
    run.set_defaults(func=cmd_run)

    pre = sub.add_parser("preflight", help="verify bundles and decide what the driver will resume (init container)")
    pre.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    _config_args(pre)
    pre.add_argument("--on-corrupt", choices=["fallback", "strict"], help="default: the config's checkpoint.on_corrupt")
    pre.add_argument("--dry-run", action="store_true", help="decide and explain, move nothing")
    pre.add_argument("--json", action="store_true", help="machine-readable output")
    pre.set_defaults(func=cmd_preflight)

    st = sub.add_parser(
        "stop",
        help="ask the run writing to a checkpoint dir to stop gracefully (preStop hook, operators)",
        description="Reach the run that holds DIR's writer lease through the checkpoint volume (no Kubernetes API, "
        "no Ray connection): it finishes its step, cuts a bundle of it within checkpoint.emergency_budget_s, "
        "releases the lease and exits 143. The same command stops an embedded `sc-app run` and a job on KubeRay.",
        epilog="exit codes: 0 the run stopped (or no run was writing); 1 it was still running when --wait ended; "
        "2 bad input",
    )
    st.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    st.add_argument(
        "--wait",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="wait until the run released its lease (default 0: just ask)",
    )
    st.set_defaults(func=cmd_stop)

    ck = sub.add_parser("ckpt", help="operator tools for checkpoint bundles")
    cks = ck.add_subparsers(dest="ckpt_command", required=True, parser_class=_Parser)
    ls = cks.add_parser("list", help="list bundles (sizes and structure, no hashing)")
    ls.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ckpt_list)
    ver = cks.add_parser("verify", help="check every file's digest and the replay digests")
    ver.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    ver.add_argument("bundle", nargs="*", help="bundle names (default: all)")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=cmd_ckpt_verify)
    pr = cks.add_parser("prune", help="keep the newest N bundles (the newest verified one always stays)")
    pr.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    pr.add_argument("--keep", type=int, required=True)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_ckpt_prune)

    ex = sub.add_parser(
        "export",
        help="write a bundle's policy in Hugging Face layout (model.backend=hf runs)",
        description="Verify a bundle and write its policy as safetensors + config + tokenizer into a new directory "
        "that AutoModelForCausalLM.from_pretrained loads.",
    )
    ex.add_argument("--checkpoint-dir", metavar="DIR", required=True)
    ex.add_argument("--step", metavar="N", type=int, help="the bundle step_N (default: the newest verified one)")
    ex.add_argument("--out", metavar="DIR", required=True, help="a new (or empty) directory")
    ex.set_defaults(func=cmd_export)

    rp = sub.add_parser(
        "report",
        help="plots (PNG) and a Markdown summary from the run log",
        description="Read the run log (metrics.jsonl, every attempt) and write reward/loss, step-time and save "
        "plots plus report.md. Needs no cluster.",
    )
    src = rp.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint-dir", metavar="DIR", help="the run's checkpoint.dir (its log is DIR/logs)")
    src.add_argument("--log-dir", metavar="DIR", help="the run's run.log_dir, when it was set")
    rp.add_argument("--out", metavar="DIR", help="where to write (default: <log dir>/report)")
    rp.add_argument("--json", action="store_true", help="print the summary as JSON")
    rp.set_defaults(func=cmd_report)

    cf = sub.add_parser("config", help="print the resolved config as YAML")
    _config_args(cf)
    cf.set_defaults(func=cmd_config)

    try:
        from sc_app.k8s.cli import register
    except ImportError:
        pass
    else:
        register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (ConfigError, _BadDir, LeaseError, LineageError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_FAILED)
