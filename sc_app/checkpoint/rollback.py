"""Roll a checkpoint directory back to ``step_K``: every newer bundle moved to ``quarantine/`` (never deleted).

Invariants:
- nothing moves while a run holds the directory's live writer lease (a stopping pod's ``preStop`` could still
  publish a bundle newer than K after the move, and the next run would resume from it): ``RollbackRefused``;
- ``step_K`` must be a bundle the directory's ``BundleRules`` accept (``selection.choose_bundle`` with ``step=K``:
  it verifies, and belongs to the directory's lineage) before anything moves, so a rollback never leaves the
  directory without a bundle to resume;
- the moves happen under the directory lock a writer takes to acquire the lease, and the lease is checked again
  inside it;
- a ``quarantine`` that cannot take them (a file, a link, not writable) refuses before anything moves (also for a
  dry run); a move that fails midway is one line naming what moved;
- a pinned bundle's pin (``pins/step_N``) goes with it (``quarantine.move_aside``): left behind, it would silently
  pin the next bundle of that name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sc_app.checkpoint import layout
from sc_app.checkpoint.lease import dir_lock, live_holder
from sc_app.checkpoint.quarantine import QuarantineError, check_quarantine, move_aside
from sc_app.checkpoint.selection import BundleRules, choose_bundle


class RollbackRefused(Exception):
    """One line: why nothing was moved."""


@dataclass
class Rollback:
    target: str
    moved: list[str] = field(default_factory=list)  # where each newer bundle went


def _holder_line(root: Path) -> str | None:
    holder = live_holder(root)
    if holder is None:
        return None
    return (
        f"run {holder.run_id} (epoch {holder.fencing_epoch}, {holder.host}) holds a live lease on {root}: it may "
        "still publish a bundle after the rollback; stop it first (`sc-app k8s suspend RELEASE --wait`, or `sc-app "
        f"stop --checkpoint-dir {root} --wait 120`) and roll back when no run writes"
    )


def rollback(rules: BundleRules, step: int, *, dry_run: bool = False) -> Rollback:
    """Move every ``step_N`` of ``rules.root`` with N > ``step`` into ``quarantine/``; ``RollbackRefused``
    (nothing moved) when ``step_K`` is not a usable bundle or a run holds the lease."""
    root = rules.root
    problem = _holder_line(root)
    if problem:
        raise RollbackRefused(problem)
    plan = choose_bundle(rules, step=step)
    if plan.decision != "resume" or plan.bundle is None:
        raise RollbackRefused(f"{plan.reason}; roll back to another step")
    newer = [path for n, path in layout.step_dirs(root) if n > step]
    out = Rollback(target=plan.bundle.name)
    _check_movable(root, newer)
    if dry_run:
        out.moved = [p.name for p in newer]
        return out
    with dir_lock(root):
        problem = _holder_line(root)
        if problem:
            raise RollbackRefused(problem)
        _check_movable(root, newer)
        for path in newer:
            try:
                dest = move_aside(path, root / layout.QUARANTINE_DIR, f"rolled back to {out.target}")
            except QuarantineError as exc:
                done = ", ".join(out.moved) or "nothing"
                raise RollbackRefused(f"{exc}; moved before that: {done}; fix it and rerun the rollback") from None
            pin = " (with its pin)" if os.path.lexists(f"{dest}.pin") else ""
            out.moved.append(str(dest.relative_to(root)) + pin)
    return out


def _check_movable(root: Path, newer: list[Path]) -> None:
    """``RollbackRefused`` (nothing moved) when ``newer`` cannot go to quarantine."""
    if newer:
        try:
            check_quarantine(root / layout.QUARANTINE_DIR)
        except QuarantineError as exc:
            raise RollbackRefused(f"{exc}; nothing moved") from None
