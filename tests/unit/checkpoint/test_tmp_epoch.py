"""Issue 31 J: a leased writer's ``tmp_step_N`` is keyed by run id *and* lease epoch, so a writer fenced off by an
in-job restore (same run, epoch + 1) never shares a tmp dir with its successor; leftovers named the older ways
(``tmp_step_N``, ``tmp_step_N.<run>``) are still recognised and moved aside by tidying."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint import BundleWriter, layout, verify_bundle
from sc_app.checkpoint.lease import Lease, LeaseLost
from sc_app.checkpoint.resume import plan_resume
from tests.support.bundles import make_bundle, tree, write_contents


def test_tmp_name_carries_run_and_epoch() -> None:
    assert layout.tmp_name(7, "3fa9c2e1b7d0", 4) == "tmp_step_7.3fa9c2e1b7d0.e4"
    assert layout.parse_tmp("tmp_step_7.3fa9c2e1b7d0.e4") == 7
    assert layout.parse_tmp("tmp_step_7.3fa9c2e1b7d0") == 7, "the pre-epoch name is still a leftover"
    assert layout.parse_tmp("tmp_step_7.run.e") is None and layout.parse_tmp("tmp_step_7.run.ex1") is None


def test_same_run_next_epoch_gets_its_own_tmp_dir(tmp_path: Path) -> None:
    first = Lease.acquire(tmp_path, "run-a")
    old = BundleWriter(tmp_path, 6, lease=first).begin()
    write_contents(old, 6)
    kept = tree(old.tmp)
    successor = first.advance()  # an in-job restore: same run id, one epoch on
    new = BundleWriter(tmp_path, 6, lease=successor).begin()
    assert old.tmp != new.tmp and old.tmp.is_dir() and new.tmp.is_dir()
    assert new.tmp.name == f"tmp_step_6.run-a.e{successor.fencing_epoch}"
    old.abort()
    assert tree(old.tmp) == kept, "a fenced-off writer must neither delete nor reach its successor's tmp dir"
    with pytest.raises(LeaseLost):
        old.commit({"replay": {"digest": "x"}})
    assert verify_bundle(new.commit(write_contents(new, 6))).ok


@pytest.mark.parametrize("name", ["tmp_step_8", "tmp_step_8.oldrun", "tmp_step_8.oldrun.e3"])
def test_tidy_moves_leftovers_of_every_naming(tmp_path: Path, name: str) -> None:
    make_bundle(tmp_path, 4)
    (tmp_path / name / "policy").mkdir(parents=True)
    plan = plan_resume(tmp_path, tidy=True)
    assert plan.decision == "resume" and plan.step == 4
    assert not (tmp_path / name).exists()
    moved = [p.name for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and moved[0].startswith(name + ".")
