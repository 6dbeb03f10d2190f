"""checkpoint.resume: plan_resume picks the newest verified bundle, quarantines only what it may, never deletes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import BundleWriter, layout, plan_resume
from tests.support.bundles import COMPAT, contents_only, make_bundle, make_tmp_leftover, tree, truncate, write_contents


def test_fresh_when_empty_or_absent(tmp_path: Path) -> None:
    assert plan_resume(tmp_path / "nope").decision == "fresh"
    assert plan_resume(tmp_path).decision == "fresh"


def test_newest_complete_bundle_wins(tmp_path: Path) -> None:
    for step in (2, 10, 4):
        make_bundle(tmp_path, step)
    plan = plan_resume(tmp_path, expected_compat=COMPAT)
    assert plan.decision == "resume" and plan.step == 10 and plan.bundle == tmp_path / "step_10"
    assert plan.quarantined == []
    assert [r.name for r in plan.reports] == ["step_10"], "older bundles need not be hashed once one verified"


def test_tmp_leftover_is_never_resumed_and_moved_to_quarantine(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    leftover = make_tmp_leftover(tmp_path, 4)
    # even a leftover whose manifest was written (died between manifest and rename) is not resumable
    w = BundleWriter(tmp_path, 6).begin()
    fields = write_contents(w, 6)
    (w.tmp / "manifest.json").write_text(json.dumps({"format": "sc-app/bundle", "step": 6, **fields}))
    leftovers = {p.name: tree(p) for p in (leftover, w.tmp)}
    before = contents_only(tree(tmp_path))

    dry = plan_resume(tmp_path, tidy=False)
    assert dry.step == 2 and dry.quarantined == []
    assert leftover.exists() and w.tmp.exists()

    plan = plan_resume(tmp_path)
    assert plan.decision == "resume" and plan.step == 2 and plan.bundle == tmp_path / "step_2"
    assert not leftover.exists() and not w.tmp.exists()
    assert len(plan.quarantined) == 2
    quarantine = tmp_path / layout.QUARANTINE_DIR
    for name, files in leftovers.items():
        moved = [p for p in quarantine.iterdir() if p.is_dir() and p.name.startswith(name + ".")]
        assert len(moved) == 1 and tree(moved[0]) == files, f"{name} was not kept intact"
        assert (quarantine / f"{moved[0].name}.reason.txt").exists()
    after = contents_only({k: v for k, v in tree(tmp_path).items() if not k.endswith(".reason.txt")})
    assert after == before, "tidying deleted or changed a file"


def test_only_tmp_leftovers_means_fresh_and_nothing_deleted(tmp_path: Path) -> None:
    leftover = make_tmp_leftover(tmp_path, 2)
    files = tree(leftover)
    plan = plan_resume(tmp_path)
    assert plan.decision == "fresh"
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert [tree(p) for p in moved] == [files]


@pytest.mark.parametrize(
    ("rel", "damage"),
    [("policy/model.pt", truncate), ("replay_buffer_metadata.pt", Path.unlink), ("train_dataloader.pt", Path.unlink)],
)
def test_strict_refuses_a_bad_newest_bundle_and_moves_nothing(tmp_path: Path, rel: str, damage: Any) -> None:
    make_bundle(tmp_path, 2)
    newest = make_bundle(tmp_path, 4)
    damage(newest / rel)
    before = tree(tmp_path)
    plan = plan_resume(tmp_path, on_corrupt="strict")
    assert plan.decision == "refuse" and not plan.ok
    assert str(newest / rel) in plan.reason and "strict" in plan.reason, plan.reason
    assert plan.bundle is None
    assert tree(tmp_path) == before, "strict must not move or delete anything"


@pytest.mark.parametrize(
    ("rel", "damage"),
    [("policy/model.pt", truncate), ("replay_buffer_metadata.pt", Path.unlink)],
)
def test_fallback_resumes_older_and_quarantines_the_bad_one(tmp_path: Path, rel: str, damage: Any) -> None:
    make_bundle(tmp_path, 2)
    newest = make_bundle(tmp_path, 4)
    damage(newest / rel)
    bad_files = tree(newest)
    before = contents_only(tree(tmp_path))
    plan = plan_resume(tmp_path, on_corrupt="fallback")
    assert plan.decision == "resume" and plan.step == 2
    assert "step_4" in plan.reason
    assert any(str(newest / rel) in p for p in plan.reports[0].problems)
    assert not newest.exists()
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and tree(moved[0]) == bad_files, "the bad bundle must be kept, not deleted"
    reason = (tmp_path / layout.QUARANTINE_DIR / f"{moved[0].name}.reason.txt").read_text()
    assert str(newest / rel) in reason
    after = contents_only({k: v for k, v in tree(tmp_path).items() if not k.endswith(".reason.txt")})
    assert after == before


def test_no_bundle_verifies_refuses_and_moves_nothing(tmp_path: Path) -> None:
    b2, b4 = make_bundle(tmp_path, 2), make_bundle(tmp_path, 4)
    truncate(b2 / "policy/model.pt")
    (b4 / "train_dataloader.pt").unlink()
    before = tree(tmp_path)
    for on_corrupt in ("fallback", "strict"):
        plan = plan_resume(tmp_path, on_corrupt=on_corrupt)  # type: ignore[arg-type]
        assert plan.decision == "refuse", on_corrupt
        assert "train_dataloader.pt" in plan.reason, plan.reason
        assert tree(tmp_path) == before, f"{on_corrupt}: a refused plan moved or deleted files"


def test_incompatible_config_is_a_refusal_naming_the_key(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    before = tree(tmp_path)
    plan = plan_resume(tmp_path, on_corrupt="strict", expected_compat={**COMPAT, "run.seed": 1})
    assert plan.decision == "refuse" and "run.seed" in plan.reason
    assert tree(tmp_path) == before
