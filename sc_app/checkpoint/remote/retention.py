"""Retention on the bucket, by the rules of the local tier (``sc_app.checkpoint.retention``): the bundles the fencing
record lists beyond the newest ``keep``, counted from the newest one that counts (the anchor, never removed), are
removed — never one newer than the anchor, never one of another lineage, never one that does not count (left for an
operator to inspect, as a bad local bundle is).

A bundle leaves the record first (a compare-and-swap: ``fence.retire``), and only then are its objects deleted, so a
reader never finds a listed bundle with half of its files; objects a failed delete leaves behind are listed by no
record (never a bundle; ``sc-app ckpt list --remote`` names them).
"""

from __future__ import annotations

import logging

from sc_app.checkpoint.remote.bundles import RemoteBundle, check
from sc_app.checkpoint.remote.fence import BUNDLES, RemoteLease, read_record, retire
from sc_app.checkpoint.remote.record import Published
from sc_app.checkpoint.remote.store import RemoteError, Store

log = logging.getLogger(__name__)


def prune_remote(
    store: Store, keep: int, *, lineage: str | None, hmac_key: bytes | None, lease: RemoteLease | None = None
) -> list[str]:
    """Remove the bucket's bundles beyond the newest ``keep`` (the module docstring); returns the names removed.
    ``lease``: only while it still holds the bucket (a run's own retention); None: an operator's command."""
    if keep < 1:
        raise ValueError("keep must be >= 1: the newest bundle that counts is always kept")
    record, _ = read_record(store)
    if record is None or len(record.bundles) <= keep:  # nothing beyond keep: not one request more
        return []
    checked: dict[int, RemoteBundle] = {}

    def judged(e: Published) -> RemoteBundle:
        if e.step not in checked:
            checked[e.step] = check(store, e, lineage=lineage, hmac_key=hmac_key, digests=False)
        return checked[e.step]

    entries = record.newest_first()
    anchor = next((e for e in entries if judged(e).ok), None)
    if anchor is None:
        log.warning("remote tier: no bundle on %s counts; removing nothing", store.where(store.key(BUNDLES)))
        return []
    doomed, kept = [], 0
    for e in entries:
        if e.step > anchor.step:
            continue
        bundle = judged(e)
        if bundle.manifest is not None and lineage is not None and bundle.manifest.lineage not in (None, lineage):
            continue
        kept += 1
        if kept <= keep or e.step == anchor.step:
            continue
        if not bundle.ok:
            log.warning("remote tier: leaving %s, it does not count (%s)", bundle.name, bundle.problems[0])
            continue
        doomed.append(e)
    removed = retire(store, lease, doomed) if doomed else []
    for e in removed:
        _delete_objects(store, e)
    return [f"step_{e.step}" for e in removed]


def _delete_objects(store: Store, entry: Published) -> None:
    prefix = store.key(BUNDLES, entry.dir) + "/"
    try:
        keys = [key for key, _ in store.list(prefix)]
        if keys:
            store.delete_many(keys)
    except RemoteError as exc:  # unlisted already: what is left is no bundle
        log.warning("remote tier: step_%d left the record, some of its objects stay: %s", entry.step, exc)
