"""checkpoint.rollback: step_K is judged by the directory's ``BundleRules`` (the one bundle decision), newer bundles
go to quarantine/ (never deleted), and nothing moves while a run holds the lease."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.lineage import ensure_lineage
from sc_app.checkpoint.rollback import RollbackRefused, rollback
from sc_app.checkpoint.selection import BundleRules
from tests.support.bundles import flip_byte, make_bundle

OURS, THEIRS = "lin-ours", "lin-theirs"


def steps(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob("step_*"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    ensure_lineage(tmp_path, adopt=OURS)
    for step in (2, 4, 6):
        make_bundle(tmp_path, step, lineage=OURS)
    return tmp_path


def test_newer_bundles_move_to_quarantine_and_a_dry_run_moves_nothing(root: Path) -> None:
    planned = rollback(BundleRules.of_dir(root), 4, dry_run=True)
    assert (planned.target, planned.moved, steps(root)) == ("step_4", ["step_6"], ["step_2", "step_4", "step_6"])
    done = rollback(BundleRules.of_dir(root), 2)
    assert steps(root) == ["step_2"] and [m.split("/")[0] for m in done.moved] == ["quarantine", "quarantine"]
    assert sorted(p.name[:7] for p in (root / "quarantine").iterdir() if p.is_dir()) == ["step_4.", "step_6."]


def test_a_target_that_fails_the_rules_is_refused_and_nothing_moves(root: Path) -> None:
    make_bundle(root, 3, lineage=THEIRS)
    with pytest.raises(RollbackRefused, match="belongs to lineage"):
        rollback(BundleRules.of_dir(root), 3)
    flip_byte(next((root / "step_4").rglob("*.pt")))
    with pytest.raises(RollbackRefused, match="does not verify"):
        rollback(BundleRules.of_dir(root), 4)
    with pytest.raises(RollbackRefused, match=r"^no step_5 in "):
        rollback(BundleRules.of_dir(root), 5)
    assert steps(root) == ["step_2", "step_3", "step_4", "step_6"]


def test_a_live_lease_refuses(root: Path) -> None:
    lease = Lease.acquire(root, "run-still-stopping")
    try:
        with pytest.raises(RollbackRefused, match=r"run run-still-stopping \(epoch 1, .*\) holds a live lease"):
            rollback(BundleRules.of_dir(root), 2)
    finally:
        lease.release("stopped")
    assert steps(root) == ["step_2", "step_4", "step_6"]
