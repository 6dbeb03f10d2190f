"""Roll a checkpoint directory back to ``step_K``: every newer bundle moved to ``quarantine/`` (never deleted).

Invariants:
- nothing moves while a run holds the directory's live writer lease (a stopping pod's ``preStop`` could still
  publish a bundle newer than K after the move, and the next run would resume from it): ``RollbackRefused``;
- ``step_K`` must exist and verify before anything moves, so a rollback never leaves the directory without a bundle
  to resume;
- the moves happen under the directory lock a writer takes to acquire the lease, and the lease is checked again
  inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sc_app.checkpoint import layout
from sc_app.checkpoint.lease import dir_lock, live_holder
from sc_app.checkpoint.quarantine import move_aside
from sc_app.checkpoint.verify import verify_bundle


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
        f"run {holder.run_id} (epoch {holder.epoch}, {holder.host}) holds a live lease on {root}: it may still "
        "publish a bundle after the rollback; stop it first (`sc-app k8s suspend RELEASE --wait`, or `sc-app stop "
        f"--checkpoint-dir {root} --wait 120`) and roll back when no run writes"
    )


def rollback(root: Path, step: int, *, hmac_key: bytes | None = None, dry_run: bool = False) -> Rollback:
    """Move every ``step_N`` with N > ``step`` into ``quarantine/``; ``RollbackRefused`` (nothing moved) otherwise."""
    target = root / layout.step_name(step)
    if not target.is_dir():
        raise RollbackRefused(f"no {target.name} in {root}; `sc-app ckpt list --checkpoint-dir {root}` shows them")
    problem = _holder_line(root)
    if problem:
        raise RollbackRefused(problem)
    report = verify_bundle(target, hmac_key=hmac_key)
    if not report.ok:
        raise RollbackRefused(f"{target} does not verify ({report.problems[0]}); roll back to another step")
    newer = [path for n, path in layout.step_dirs(root) if n > step]
    out = Rollback(target=target.name)
    if dry_run:
        out.moved = [p.name for p in newer]
        return out
    with dir_lock(root):
        problem = _holder_line(root)
        if problem:
            raise RollbackRefused(problem)
        for path in newer:
            dest = move_aside(path, root / layout.QUARANTINE_DIR, f"rolled back to {target.name}")
            out.moved.append(str(dest.relative_to(root)))
    return out
