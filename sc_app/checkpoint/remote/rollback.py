"""Roll the bucket back to ``step_K`` (``sc-app ckpt rollback --remote``): every bundle the fencing record lists
newer than K moves to the record's ``quarantined`` list — its objects stay on the bucket (never deleted), it no longer
counts, no attempt resumes from it, and retention never touches it.

Invariants (the local rollback's, ``sc_app.checkpoint.rollback``, on the bucket):

- ``step_K`` must be listed by the record and *verify* (manifest, lineage, every file's digest read back) before
  anything changes, so a rollback never leaves the bucket without a bundle to resume;
- the change is one compare-and-swap of the record (``If-Match``), which also takes the bucket (epoch + 1, as a new
  attempt does): an attempt still running is fenced — its later uploads are refused and never become bundles — so
  nothing newer than K is published after the rollback. (The bucket cannot say whether its holder still runs, as the
  local lease's heartbeat can: stop the job first; the fencing makes a forgotten one harmless.)
- the bundles moved are those newer than K in the record the swap replaces (one published between the check and the
  swap moves too); a 412 re-reads and decides again.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from sc_app.checkpoint import layout
from sc_app.checkpoint.remote.bundles import check
from sc_app.checkpoint.remote.fence import CAS_TRIES, RECORD_KEY, read_record
from sc_app.checkpoint.remote.record import Published
from sc_app.checkpoint.remote.store import PreconditionFailed, Store
from sc_app.io.durable import utc_stamp

log = logging.getLogger(__name__)


class RemoteRollbackRefused(Exception):
    """One line: why the record was not changed."""


@dataclass
class RemoteRollback:
    target: str
    moved: list[str] = field(default_factory=list)  # "step_N (<upload dir>)" of each bundle quarantined
    epoch: int = 0  # the epoch the rollback took the bucket at (0: a dry run)


def rollback_remote(store: Store, step: int, *, hmac_key: bytes | None, dry_run: bool = False) -> RemoteRollback:
    """Quarantine every bundle the bucket's record lists newer than ``step`` (the module docstring);
    ``RemoteRollbackRefused`` (nothing changed) when ``step_K`` is not a listed bundle that verifies."""
    record, _ = read_record(store)
    where = store.where(store.key(RECORD_KEY))
    if record is None:
        raise RemoteRollbackRefused(f"no sc-app bundles at {store.target.url} (no fencing record there)")
    target = record.published(step)
    if target is None:
        listed = ", ".join(layout.step_name(e.step) for e in record.newest_first()) or "none"
        raise RemoteRollbackRefused(
            f"{layout.step_name(step)} is not a bundle on the bucket (listed: {listed}); roll back to one of those"
        )
    judged = check(store, target, lineage=record.lineage, hmac_key=hmac_key, digests=True)
    if not judged.ok:
        raise RemoteRollbackRefused(
            f"{judged.name} on the bucket does not verify ({judged.problems[0]}); nothing changed: roll back to "
            "another step"
        )
    out = RemoteRollback(target=judged.name)
    if dry_run:
        out.moved = [_named(e) for e in record.newest_first() if e.step > step]
        return out
    operator = f"rollback-{uuid.uuid4().hex[:8]}"
    for _ in range(CAS_TRIES):
        current, etag = read_record(store)
        if current is None or current.published(step) != target:
            raise RemoteRollbackRefused(
                f"{where} changed while the rollback checked {judged.name} (it is no longer listed as checked); "
                "nothing changed: rerun the rollback"
            )
        newer = [e for e in current.newest_first() if e.step > step]
        now = utc_stamp()
        new = current.taken_by(operator, now).quarantine(newer, f"rolled back to {judged.name}", now)
        try:
            store.put_small(store.key(RECORD_KEY), new.to_json(), if_match=etag)
        except PreconditionFailed:
            continue
        out.moved, out.epoch = [_named(e) for e in newer], new.epoch
        log.info("rolled %s back to %s (epoch %d)", where, judged.name, new.epoch)
        return out
    raise RemoteRollbackRefused(f"{where}: could not change it in {CAS_TRIES} tries (other writers keep changing it)")


def _named(e: Published) -> str:
    return f"{layout.step_name(e.step)} ({e.dir})"
