"""``sc-app ckpt list|verify|prune|rollback --remote s3://bucket/prefix``: the bundles on the bucket
(``docs/object-storage.md``).

``list`` reads the bucket's fencing record and checks each listed bundle's manifest and object sizes (no bytes
hashed); it also names upload directories no record lists (an attempt that was superseded or died before it
published: never bundles). ``verify`` reads every listed file back and checks its digest; both are read-only.
``prune --keep N`` applies the local tier's retention rules to the bucket (``remote/retention.py``): it drops
bundles from the record, then deletes their objects. ``rollback --to K`` moves the bundles newer than K to the
record's quarantine list and takes the bucket, fencing any attempt still running (``remote/rollback.py``).
Credentials: boto3's standard chain, as for a run.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from sc_app.exits import EXIT_BAD_INPUT, EXIT_OK, fail


def add_remote(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("remote tier (instead of --checkpoint-dir)")
    g.add_argument("--remote", metavar="S3_URL", help="s3://bucket/prefix, as checkpoint.remote.url")
    g.add_argument("--endpoint", metavar="URL", help="as checkpoint.remote.endpoint (non-AWS servers)")
    g.add_argument("--region", help="as checkpoint.remote.region")
    g.add_argument("--addressing-style", choices=["auto", "path", "virtual"], default="auto")


def open_bucket_of(args: argparse.Namespace) -> Any:
    """The store of ``--remote``/``--endpoint``/``--region``/``--addressing-style`` and the bucket's fencing record
    (None: no sc-app bundles there); ``ValueError``/``RemoteError``/``RecordError`` as one line."""
    from pydantic import ValidationError

    from sc_app.checkpoint.remote.fence import read_record
    from sc_app.checkpoint.remote.store import Store
    from sc_app.config.remote import RemoteConfig

    try:
        cfg = RemoteConfig(url=args.remote, endpoint=args.endpoint, region=args.region,
                           addressing_style=args.addressing_style)  # fmt: skip
    except ValidationError as exc:
        raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
    store = Store(cfg)
    record, _ = read_record(store)
    return store, record


def cmd_remote(args: argparse.Namespace, *, digests: bool) -> int:
    from sc_app.checkpoint import hmac_key_from_env
    from sc_app.checkpoint.remote.bundles import check
    from sc_app.checkpoint.remote.fence import BUNDLES
    from sc_app.checkpoint.remote.record import RecordError
    from sc_app.checkpoint.remote.store import RemoteError

    try:
        store, record = open_bucket_of(args)
        if record is None:
            return fail(f"no sc-app bundles at {args.remote} (no fencing record there)")
        named = set(getattr(args, "bundle", None) or [])
        entries = [e for e in record.newest_first() if not named or f"step_{e.step}" in named]
        if named - {f"step_{e.step}" for e in entries}:
            return fail(
                f"no bundle named {', '.join(sorted(named))} on {args.remote} (see `sc-app ckpt list --remote`)"
            )
        key = hmac_key_from_env()
        rows = [check(store, e, lineage=record.lineage, hmac_key=key, digests=digests) for e in entries]
        listed = {e.dir for e in record.bundles} | {q.bundle.dir for q in record.quarantined}
        prefix = store.key(BUNDLES) + "/"
        unpublished = sorted({k[len(prefix) :].split("/", 1)[0] for k, _ in store.list(prefix)} - listed)
    except (RemoteError, RecordError, ValueError) as exc:
        return fail(str(exc))
    out = [
        {"name": r.name, "step": r.entry.step, "ok": r.ok, "problems": list(r.problems), "dir": r.entry.dir,
         "run_id": r.entry.run_id, "epoch": r.entry.epoch, "published_at": r.entry.at,
         "bytes": sum(int(f["size"]) for f in r.manifest.files.values()) if r.manifest else None}
        for r in rows
    ]  # fmt: skip
    quarantined = [{"name": f"step_{q.bundle.step}", "dir": q.bundle.dir, "why": q.why, "moved_at": q.moved_at}
                   for q in record.quarantined]  # fmt: skip
    if args.json:
        print(json.dumps({"holder": {"run_id": record.run_id, "epoch": record.epoch}, "lineage": record.lineage,
                          "bundles": out, "unpublished": unpublished, "quarantined": quarantined},
                         indent=2))  # fmt: skip
    else:
        print(f"{args.remote}: lineage {record.lineage}, held by run {record.run_id} (epoch {record.epoch})")
        for r in out:
            state = ("verified" if digests else "ok") if r["ok"] else "BAD: " + "; ".join(r["problems"])
            size = f"{(r['bytes'] or 0) / 2**20:8.2f} MiB"
            print(f"{r['name']:<14} {state}  {size}  run {r['run_id']} (epoch {r['epoch']}) at {r['published_at']}")
        for name in unpublished:
            print(f"{name}: unpublished upload (no record lists it: never a bundle)")
        for q in quarantined:
            print(f"{q['dir']}: quarantined ({q['why']}, {q['moved_at']}): kept on the bucket, never resumed")
    return EXIT_OK if all(r["ok"] for r in out) or not digests else EXIT_BAD_INPUT


def cmd_remote_prune(args: argparse.Namespace) -> int:
    """``ckpt prune --remote``: the bucket's retention, by the local tier's rules (``remote/retention.py``)."""
    from sc_app.checkpoint import hmac_key_from_env
    from sc_app.checkpoint.remote.fence import RemoteLeaseLost, RemoteRefused
    from sc_app.checkpoint.remote.probe import probe_conditional_writes
    from sc_app.checkpoint.remote.record import RecordError
    from sc_app.checkpoint.remote.retention import prune_remote
    from sc_app.checkpoint.remote.store import RemoteError

    try:
        store, record = open_bucket_of(args)
        if record is None:
            return fail(f"no sc-app bundles at {args.remote} (no fencing record there)")
        probe_conditional_writes(store)  # the record is changed by compare-and-swap: learn the server's If-Match
        removed = prune_remote(store, args.keep, lineage=record.lineage, hmac_key=hmac_key_from_env())
    except (RemoteError, RecordError, RemoteLeaseLost, RemoteRefused, ValueError) as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps({"removed": removed}))
    else:
        print("removed " + (", ".join(removed) if removed else "nothing"))
    return EXIT_OK


def cmd_remote_rollback(args: argparse.Namespace) -> int:
    """``ckpt rollback --remote --to K``: the bucket's bundles newer than K quarantined (``remote/rollback.py``)."""
    from sc_app.checkpoint import hmac_key_from_env
    from sc_app.checkpoint.remote.probe import probe_conditional_writes
    from sc_app.checkpoint.remote.record import RecordError
    from sc_app.checkpoint.remote.rollback import RemoteRollbackRefused, rollback_remote
    from sc_app.checkpoint.remote.store import RemoteError

    try:
        store, _ = open_bucket_of(args)
        if not args.dry_run:
            probe_conditional_writes(store)  # the record is changed by compare-and-swap: learn the server's If-Match
        done = rollback_remote(store, args.to, hmac_key=hmac_key_from_env(), dry_run=args.dry_run)
    except (RemoteRollbackRefused, RemoteError, RecordError, ValueError) as exc:
        return fail(str(exc))
    verb = "would quarantine" if args.dry_run else "quarantined"
    moved = ", ".join(done.moved) if done.moved else "nothing"
    fenced = f"; the bucket is now held at epoch {done.epoch}: a run still writing there publishes nothing more" \
        if done.epoch else ""
    print(f"resume point on {args.remote}: {done.target}; {verb} {moved}{fenced}")
    return EXIT_OK
