"""Retention: which complete bundles ``prune`` may delete.

Invariants: ``prune`` removes only complete bundles of the directory's own lineage older than the newest verified
one, never a pinned one (``<root>/pins/step_N``), and never one it could not verify (manifest + sizes): an
unreadable old bundle is left for an operator to inspect. A ``step_N`` that is a link or not a directory, and a
bundle of another lineage (``expected_lineage``), are neither deleted nor counted towards ``keep`` nor taken as the
anchor: a foreign bundle copied in with a high step cannot push the lineage's own bundles out. A bundle leaves the
``step_N`` namespace in one rename before its files go, so a reader (preflight, verify) never sees a half-deleted
bundle. Only the lease holder (or a command that found no live lease, under the directory lock) calls it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from sc_app.checkpoint import layout
from sc_app.checkpoint.hmac_keys import HmacKey
from sc_app.checkpoint.verify import lineage_problem, verify_bundle
from sc_app.io.durable import fsync_dir

log = logging.getLogger(__name__)


PRUNING_PREFIX = ".pruning-"  # a bundle being deleted: renamed first, so no reader ever sees half of a step_N


def _delete(bundle: Path) -> None:
    """Remove a bundle atomically for readers: rename it out of the ``step_N`` namespace, then delete it."""
    doomed = bundle.with_name(f"{PRUNING_PREFIX}{bundle.name}")
    os.rename(bundle, doomed)
    fsync_dir(bundle.parent)
    shutil.rmtree(doomed)


def _finish_interrupted_deletes(root: Path) -> None:
    """A prune killed mid-delete leaves ``.pruning-step_N``: retention had already decided it goes."""
    for leftover in root.glob(f"{PRUNING_PREFIX}step_*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


def pinned(root: Path) -> set[str]:
    pins = root / layout.PINS_DIR
    return {p.name for p in pins.iterdir()} if layout.is_real_dir(pins) else set()


def prune(
    root: str | Path,
    keep: int,
    *,
    hmac_key: HmacKey | None = None,
    newest_verified: Path | None = None,
    expected_lineage: str | None = None,
) -> list[str]:
    """Delete complete bundles beyond the newest ``keep``, oldest first; returns the names removed."""
    if keep < 1:
        raise ValueError("keep must be >= 1: the newest verified bundle is always kept")
    root = Path(root)
    _finish_interrupted_deletes(root)
    bundles = layout.step_dirs(root)  # real directories only: a link is never followed, counted or removed
    if newest_verified is None:
        for _, path in bundles:
            if verify_bundle(path, hmac_key=hmac_key, expected_lineage=expected_lineage).ok:
                newest_verified = path
                break
    if newest_verified is None:
        log.warning("prune: no bundle in %s verifies; removing nothing", root)
        return []
    anchor = layout.parse_step(newest_verified.name)
    assert anchor is not None
    pins = pinned(root)
    kept = 0
    removed = []
    for step, path in bundles:
        if step > anchor:  # newer than the newest verified: may be a save in progress elsewhere; leave it
            continue
        if path.name in pins:
            continue
        report = verify_bundle(path, deep=False, hmac_key=hmac_key, expected_lineage=expected_lineage)
        if report.manifest is not None and lineage_problem(report.manifest, expected_lineage):
            log.warning("prune: leaving %s, it belongs to lineage %s", path.name, report.manifest.lineage)
            continue
        kept += 1
        if kept <= keep or step == anchor:
            continue
        if report.problems:
            log.warning("prune: leaving %s, it does not verify (%s)", path.name, report.problems[0])
            continue
        _delete(path)
        removed.append(path.name)
    if removed:
        fsync_dir(root)
    return removed
