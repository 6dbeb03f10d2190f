"""``sc-app ckpt list|verify|prune|rollback``: operator tools for the bundles of a checkpoint directory (each also of
the remote tier, ``--remote s3://bucket/prefix``: ``ckpt_remote.py``).

Every bundle is judged by the directory's ``BundleRules`` (``sc_app.checkpoint.selection``): a bundle of another
lineage is listed and verified as BAD, never pruned nor counted, and never a rollback target.
"""

from __future__ import annotations

import argparse
import json

from sc_app.checkpoint import layout
from sc_app.checkpoint.selection import BundleRules
from sc_app.cli.ckpt_remote import add_remote, cmd_remote, cmd_remote_prune, cmd_remote_rollback
from sc_app.cli.options import add_checkpoint_dir, add_json, checkpoint_root
from sc_app.exits import EXIT_BAD_INPUT, EXIT_OK, Parser, fail


def register(sub: argparse._SubParsersAction) -> None:
    ck = sub.add_parser("ckpt", help="operator tools for checkpoint bundles")
    cks = ck.add_subparsers(dest="ckpt_command", required=True, parser_class=Parser)
    ls = cks.add_parser("list", help="list bundles (sizes and structure, no hashing)")
    add_checkpoint_dir(ls, required=False)
    add_remote(ls)
    add_json(ls)
    ls.set_defaults(func=cmd_ckpt_list)
    ver = cks.add_parser("verify", help="check every file's digest and the replay digests")
    add_checkpoint_dir(ver, required=False)
    add_remote(ver)
    ver.add_argument("bundle", nargs="*", help="bundle names (default: all)")
    add_json(ver)
    ver.set_defaults(func=cmd_ckpt_verify)
    pr = cks.add_parser("prune", help="keep the newest N bundles (the newest verified one always stays)")
    add_checkpoint_dir(pr, required=False)
    add_remote(pr)
    pr.add_argument("--keep", type=int, required=True)
    add_json(pr)
    pr.set_defaults(func=cmd_ckpt_prune)
    rb = cks.add_parser(
        "rollback", help="move every bundle newer than step_K to quarantine/ (refused while a run holds the lease; "
        "--remote: to the bucket record's quarantine list, fencing any run still writing there)"
    )
    add_checkpoint_dir(rb, required=False)
    add_remote(rb)
    rb.add_argument("--to", metavar="K", type=int, required=True, help="the step to resume from next")
    rb.add_argument("--dry-run", action="store_true", help="say what would move, move nothing")
    rb.set_defaults(func=cmd_ckpt_rollback)


def _one_tier(args: argparse.Namespace) -> str | None:
    if (args.checkpoint_dir is None) == (args.remote is None):
        return "give exactly one of --checkpoint-dir DIR and --remote s3://bucket/prefix"
    return None


def cmd_ckpt_list(args: argparse.Namespace) -> int:
    if problem := _one_tier(args):
        return fail(problem)
    if args.remote is not None:
        return cmd_remote(args, digests=False)
    root = checkpoint_root(args, must_exist=True)
    try:
        entries, leftover_dirs = layout.step_entries(root), layout.tmp_dirs(root)
    except OSError as exc:
        return fail(f"cannot list --checkpoint-dir {root}: {exc.strerror or exc}")
    rules = BundleRules.of_dir(root)
    rows = [rules.verify(p, deep=False).as_dict() for _, p in entries]
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
    if problem := _one_tier(args):
        return fail(problem)
    if args.remote is not None:
        return cmd_remote(args, digests=True)
    root = checkpoint_root(args, must_exist=True)
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
    rules = BundleRules.of_dir(root)
    reports = [rules.verify(p) for p in targets]
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
    from sc_app.checkpoint.lease import dir_lock, live_holder

    if args.keep < 1:
        return fail("--keep must be >= 1: the newest verified bundle is always kept")
    if problem := _one_tier(args):
        return fail(problem)
    if args.remote is not None:
        return cmd_remote_prune(args)
    root = checkpoint_root(args, must_exist=True)
    holder = live_holder(root)
    if holder is not None:
        return fail(
            f"run {holder.run_id} (epoch {holder.fencing_epoch}, {holder.host}) "
            f"holds a live lease on {root}: while it runs "
            "only it prunes (checkpoint.keep); stop it first (`sc-app stop`)"
        )
    with dir_lock(root):
        if live_holder(root) is not None:
            return fail(f"a run took the lease of {root} just now; rerun when it has stopped")
        removed = BundleRules.of_dir(root).prune(args.keep)
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        print("removed " + (", ".join(removed) if removed else "nothing"))
    return EXIT_OK


def cmd_ckpt_rollback(args: argparse.Namespace) -> int:
    from sc_app.checkpoint.rollback import RollbackRefused, rollback

    if problem := _one_tier(args):
        return fail(problem)
    if args.remote is not None:
        return cmd_remote_rollback(args)
    root = checkpoint_root(args, must_exist=True)
    try:
        done = rollback(BundleRules.of_dir(root), args.to, dry_run=args.dry_run)
    except RollbackRefused as exc:
        return fail(str(exc))
    except OSError as exc:  # the directory lock or a listing failed: nothing was moved by this command
        return fail(f"cannot roll back {root}: {exc.strerror or exc}")
    verb = "would move" if args.dry_run else "moved"
    print(f"resume point: {done.target}; {verb} " + (", ".join(done.moved) if done.moved else "nothing"))
    return EXIT_OK
