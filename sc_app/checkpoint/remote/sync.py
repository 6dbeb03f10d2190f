"""Resume from the bucket: when the local directory has no verified bundle as new as the bucket's newest, bring that
one home (``bundles.download``) before the resume decision runs, which then verifies and resumes it like any local
bundle. A remote bundle that does not count (manifest changed or missing, a file missing or of the wrong size) is
passed over with one line for the next older one, and so is one whose bytes differ from its manifest; a download that
fails leaves nothing behind. A server (or local disk) that fails meanwhile is no verdict on the bundle: the error
propagates, and the run stops rather than resume from something older than the bucket holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sc_app.checkpoint import layout
from sc_app.checkpoint.remote.bundles import Corrupt, RemoteBundle, check, download
from sc_app.checkpoint.remote.record import RemoteRecord
from sc_app.checkpoint.remote.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BroughtHome:
    step: int
    path: Path
    skipped: tuple[str, ...]  # remote bundles passed over, with why


def newest_counting(
    store: Store, record: RemoteRecord, *, lineage: str | None, hmac_key: bytes | None, above: int = -1
) -> tuple[RemoteBundle | None, list[str]]:
    """The newest remote bundle above step ``above`` that counts, and why each newer one did not."""
    skipped = []
    for entry in record.newest_first():
        if entry.step <= above:
            break
        bundle = check(store, entry, lineage=lineage, hmac_key=hmac_key, digests=False)
        if bundle.ok:
            return bundle, skipped
        skipped.append(f"{bundle.name} ({entry.dir}): {'; '.join(bundle.problems)}")
    return None, skipped


def bring_newer(
    store: Store,
    record: RemoteRecord | None,
    root: Path,
    *,
    local_newest: Callable[[], int | None],
    lineage: str | None,
    hmac_key: bytes | None,
    concurrency: int,
) -> BroughtHome | None:
    """Download the bucket's newest counting bundle into ``root`` when no local verified bundle is as new
    (``local_newest()``: the newest verified local step, asked only when a local ``step_N`` could be as new)."""
    if record is None or not record.bundles:
        return None
    newest_remote = record.newest_first()[0].step
    local_steps = [s for s, _ in layout.step_entries(root)] if root.is_dir() else []
    above = -1
    if any(s >= newest_remote for s in local_steps):
        above = local_newest() or -1
    skipped: list[str] = []
    while True:
        bundle, passed = newest_counting(store, record, lineage=lineage, hmac_key=hmac_key, above=above)
        skipped += passed
        for line in passed:
            log.warning("remote tier: passed over %s", line)
        if bundle is None:
            return None
        if layout.step_name(bundle.entry.step) in {layout.step_name(s) for s in local_steps}:
            log.warning("remote tier: %s exists locally and does not verify; the bucket's copy is not brought "
                        "over it (`sc-app ckpt verify`)", bundle.name)  # fmt: skip
            return None
        root.mkdir(parents=True, exist_ok=True)
        try:
            path = download(store, bundle, root, concurrency=concurrency)
        except Corrupt as exc:  # that bundle never resumes: the next older one may (a server failure propagates)
            log.warning("remote tier: could not bring %s home: %s", bundle.name, exc)
            skipped.append(f"{bundle.name}: {exc}")
            record = RemoteRecord(record.lineage, record.run_id, record.epoch, record.acquired_at,
                                  tuple(b for b in record.bundles if b.step < bundle.entry.step))  # fmt: skip
            continue
        log.info("remote tier: brought %s home (%s)", bundle.name, store.where(store.key("bundles", bundle.entry.dir)))
        return BroughtHome(bundle.entry.step, path, tuple(skipped))
