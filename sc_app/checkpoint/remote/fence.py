"""Taking the bucket and publishing to it: compare-and-swap writes of the fencing record (``record.py``).

``RemoteLease`` is what an attempt holds once it took the bucket (picklable: the controller's uploader checks it);
``acquire`` takes it (epoch + 1, the newest attempt wins), ``publish`` adds a bundle only while the record still
names this attempt. A 412 means someone wrote the record between our read and our write: re-read and decide again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sc_app.checkpoint.remote.record import RECORD_FORMAT, Published, RemoteRecord
from sc_app.checkpoint.remote.store import NotFound, PreconditionFailed, Store
from sc_app.io.durable import utc_stamp

log = logging.getLogger(__name__)

RECORD_KEY = "LEASE"
BUNDLES = "bundles"
CAS_TRIES = 8


class RemoteRefused(ValueError):
    """The bucket cannot be used by this run (bad input: exit 2); one line naming the problem and what to do."""


class RemoteLeaseLost(RuntimeError):
    """Another attempt took the bucket; this one's uploads never become bundles there."""


@dataclass(frozen=True)
class RemoteLease:
    run_id: str
    epoch: int
    lineage: str


def read_record(store: Store) -> tuple[RemoteRecord | None, str | None]:
    """The record and its ETag; ``(None, None)`` when the bucket has none under the prefix yet."""
    key = store.key(RECORD_KEY)
    try:
        raw, etag = store.get_small(key, 1024 * 1024)
    except NotFound as exc:
        if exc.code == "NoSuchBucket":
            raise
        return None, None
    return RemoteRecord.parse(store.where(key), raw), etag


def acquire(store: Store, run_id: str, lineage: str) -> RemoteLease:
    """Take the bucket for ``run_id`` (epoch + 1); ``RemoteRefused`` when it holds another lineage."""
    key = store.key(RECORD_KEY)
    for _ in range(CAS_TRIES):
        current, etag = read_record(store)
        if current is not None and current.lineage != lineage:
            raise RemoteRefused(
                f"{store.where(key)} belongs to training lineage {current.lineage}, this checkpoint dir to {lineage}: "
                "another job writes there; use another checkpoint.remote.url prefix (or this job's checkpoint dir)"
            )
        now = utc_stamp()
        new = current.taken_by(run_id, now) if current else RemoteRecord(lineage, run_id, 1, now)
        try:
            store.put_small(key, new.to_json(), if_none_match=etag is None, if_match=etag)
        except PreconditionFailed:
            continue
        log.info("took %s (epoch %d)", store.where(key), new.epoch)
        return RemoteLease(run_id, new.epoch, lineage)
    raise RemoteRefused(f"{store.where(key)}: could not take it in {CAS_TRIES} tries (other writers keep changing it)")


def _check_holder(store: Store, current: RemoteRecord | None, lease: RemoteLease) -> RemoteRecord:
    if current is None or (current.run_id, current.epoch) != (lease.run_id, lease.epoch):
        who = f"run {current.run_id} (epoch {current.epoch})" if current else "nobody (the record is gone)"
        raise RemoteLeaseLost(
            f"{store.where(store.key(RECORD_KEY))} is now held by {who}; this run (epoch {lease.epoch}) publishes "
            "nothing more there"
        )
    return current


def holds(store: Store, lease: RemoteLease) -> RemoteRecord:
    """The record, as long as ``lease`` still holds the bucket; ``RemoteLeaseLost`` otherwise."""
    return _check_holder(store, read_record(store)[0], lease)


def publish(store: Store, lease: RemoteLease, entry: Published) -> bool:
    """Add ``entry`` to the record while ``lease`` holds the bucket: the commit point of a remote bundle. False when
    the record already lists that step (published before, e.g. by this lineage's previous attempt)."""
    key = store.key(RECORD_KEY)
    for _ in range(CAS_TRIES):
        current, etag = read_record(store)
        current = _check_holder(store, current, lease)
        if current.published(entry.step) is not None:
            return False
        try:
            store.put_small(key, current.with_bundle(entry).to_json(), if_match=etag)
            return True
        except PreconditionFailed:
            continue  # someone wrote it meanwhile: if it is still ours (our own retry), try again
    raise RemoteLeaseLost(f"{store.where(key)}: could not publish step {entry.step} in {CAS_TRIES} tries")


def retire(store: Store, lease: RemoteLease | None, entries: list[Published]) -> list[Published]:
    """Drop ``entries`` from the record (retention), while ``lease`` holds the bucket (None: an operator's command);
    returns those the record still listed, now dropped."""
    key = store.key(RECORD_KEY)
    for _ in range(CAS_TRIES):
        current, etag = read_record(store)
        if current is None:
            return []
        if lease is not None:
            current = _check_holder(store, current, lease)
        gone = [e for e in entries if e in current.bundles]
        if not gone:
            return []
        try:
            store.put_small(key, current.without(gone).to_json(), if_match=etag)
            return gone
        except PreconditionFailed:
            continue
    raise RemoteLeaseLost(f"{store.where(key)}: could not update it in {CAS_TRIES} tries")


__all__ = ["RECORD_FORMAT", "RemoteLease", "RemoteLeaseLost", "RemoteRefused", "acquire", "holds", "publish", "retire"]
