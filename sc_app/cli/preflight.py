"""``sc-app preflight``: verify the bundles and say what the driver will resume (the init container runs it).

The decision is ``sc_app.checkpoint.choose_bundle``'s, with the rules ``sc-app run`` applies (the config's
compat and dataset when ``--config``/``--set`` is given). It moves leftovers and bad bundles to quarantine only when
no run holds a live lease on the directory and the volume is writable, under the directory lock. With a config that
sets ``checkpoint.remote``, it first checks the bucket and brings its newest bundle home when nothing local is as
new (``sc_app.attempt.remote_tier``), so the driver resumes from it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sc_app.checkpoint import BundleRules, OnCorrupt, ResumePlan, choose_bundle
from sc_app.cli.options import add_checkpoint_dir, add_config, add_json, checkpoint_root, resolve
from sc_app.config.app import AppConfig
from sc_app.exits import EXIT_BAD_INPUT, EXIT_OK


def register(sub: argparse._SubParsersAction) -> None:
    pre = sub.add_parser("preflight", help="verify bundles and decide what the driver will resume (init container)")
    add_checkpoint_dir(pre)
    add_config(pre)
    pre.add_argument("--on-corrupt", choices=["fallback", "strict"], help="default: the config's checkpoint.on_corrupt")
    pre.add_argument("--dry-run", action="store_true", help="decide and explain, move nothing")
    add_json(pre)
    pre.set_defaults(func=cmd_preflight)


def cmd_preflight(args: argparse.Namespace) -> int:
    root = checkpoint_root(args, must_exist=False)
    cfg = resolve(args) if (args.config or args.overrides) else None
    why_read_only = _why_read_only(root, dry_run=args.dry_run)
    rules = _rules(cfg, root, on_corrupt=args.on_corrupt)
    if cfg is not None and why_read_only is None:  # checkpoint.remote: the bucket's newest, when nothing local is
        from sc_app.attempt.remote_tier import open_remote

        remote = open_remote(cfg, root)  # RemoteRefused: one line, exit 2
        if remote is not None and (brought := remote.bring_home(rules)) is not None:
            print(f"brought {brought.path.name} home from {cfg.checkpoint.remote.url}")
    if why_read_only is None and root.is_dir():
        from sc_app.checkpoint.lease import dir_lock, live_holder

        with dir_lock(root):  # a writer taking the lease now waits, so nothing of a live save is moved
            plan = choose_bundle(rules, tidy=live_holder(root) is None)
    else:
        plan = choose_bundle(rules, tidy=False)
    if args.json:
        print(json.dumps({**plan.as_dict(), "moved_nothing_because": why_read_only}, indent=2))
    else:
        _print_plan(plan, why_read_only)
    return EXIT_OK if plan.ok else EXIT_BAD_INPUT


def _rules(cfg: AppConfig | None, root: Path, *, on_corrupt: OnCorrupt | None) -> BundleRules:
    """The run's rules when a config is given (``--config``/``--set``), the directory's otherwise."""
    if cfg is None:
        return BundleRules.of_dir(root, on_corrupt=on_corrupt or "fallback")
    from sc_app.rl.hooks import current_dataset

    return BundleRules.for_run(cfg, dataset=lambda: current_dataset(cfg), on_corrupt=on_corrupt)


def _why_read_only(root: Path, *, dry_run: bool) -> str | None:
    """Why preflight must move nothing in ``root``; None when it may tidy."""
    from sc_app.checkpoint import volume
    from sc_app.checkpoint.lease import live_holder

    holder = live_holder(root) if root.is_dir() else None
    if dry_run:
        return "--dry-run"
    if holder is not None:
        return (
            f"run {holder.run_id} (epoch {holder.fencing_epoch}, {holder.host}) "
            f"holds a live lease on {root}; only the lease "
            "holder moves anything there (the next run tidies after taking the lease)"
        )
    if root.is_dir() and (problem := volume.unwritable(root)):
        return problem
    return None


def _print_plan(plan: ResumePlan, why_read_only: str | None) -> None:
    for r in plan.reports:
        state = "ok" if r.ok else "BAD: " + "; ".join(r.problems or r.incompatible)
        print(f"checked {r.name}: {state}")
    for moved in plan.quarantined:
        print(f"quarantined {moved}")
    if why_read_only and why_read_only != "--dry-run":
        print(f"moved nothing: {why_read_only}")
    where = f" {plan.bundle.name} (step {plan.step})" if plan.bundle else ""
    print(f"decision: {plan.decision}{where}: {plan.reason}")
