"""Links at the top of a checkpoint directory: a ``step_N`` (or ``quarantine``, ``tmp_step_N``, ``pins``) that is a
symbolic link is never followed by resume, retention or quarantine — reported as a problem and left alone, and what
it points to is never read, moved or deleted."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sc_app.checkpoint import BundleExistsError, BundleWriter, layout, plan_resume, prune, verify_bundle
from sc_app.cli import main
from tests.support.bundles import make_bundle, tree, truncate
from tests.support.opens import opened_files, outside


def linked_bundle(tmp_path: Path, step: int, *, dangling: bool = False) -> tuple[Path, Path, Path]:
    """``root`` with a good ``step_2`` and ``step_<step>`` linking to a good bundle kept ``elsewhere``."""
    root, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    make_bundle(root, 2)
    target = make_bundle(elsewhere, step)
    link = root / layout.step_name(step)
    link.symlink_to(tmp_path / "gone" if dangling else target, target_is_directory=True)
    return root, link, target


@pytest.mark.parametrize("dangling", [False, True], ids=["to-a-good-bundle", "dangling"])
def test_a_linked_bundle_is_reported_never_followed(tmp_path: Path, dangling: bool) -> None:
    root, link, target = linked_bundle(tmp_path, 8, dangling=dangling)
    before = tree(target)
    with opened_files() as seen:
        report = verify_bundle(link)
    assert not report.ok and "symbolic link" in report.problems[0] and str(link) in report.problems[0]
    assert outside(seen, root) == []

    plan = plan_resume(root)  # fallback, tidy: the default of a run
    assert plan.decision == "resume" and plan.step == 2
    assert any("symbolic link" in p for r in plan.reports for p in r.problems)
    assert link.is_symlink() and plan.quarantined == [], "a link is left where it is"
    assert prune(root, keep=1) == [] and link.is_symlink(), "a link is never pruned"
    assert tree(target) == before, "what the link points to is untouched"

    strict = plan_resume(root, on_corrupt="strict")
    assert strict.decision == "refuse" and "symbolic link" in strict.reason


def test_a_linked_bundle_does_not_count_towards_keep_or_anchor_retention(tmp_path: Path) -> None:
    root, link, target = linked_bundle(tmp_path, 100)
    for step in (4, 6):
        make_bundle(root, step)
    assert sorted(prune(root, keep=2)) == ["step_2"], "step_100 (a link) is neither the anchor nor counted"
    assert link.is_symlink() and (root / "step_4").is_dir() and (root / "step_6").is_dir()
    assert verify_bundle(target).ok


def test_a_save_never_replaces_or_writes_through_a_linked_step(tmp_path: Path) -> None:
    root, link, _target = linked_bundle(tmp_path, 8, dangling=True)
    with pytest.raises(BundleExistsError):
        BundleWriter(root, 8).begin()
    assert link.is_symlink()


@pytest.mark.parametrize(
    ("make", "what"),
    [
        (lambda q, elsewhere: q.write_text("not a dir"), "is a regular file"),
        (lambda q, elsewhere: q.symlink_to(elsewhere, target_is_directory=True), "is a symbolic link"),
    ],
    ids=["regular-file", "link-to-a-directory-elsewhere"],
)
def test_a_quarantine_that_is_not_a_directory_is_a_refusal_not_a_crash(
    tmp_path: Path, make: Callable[[Path, Path], None], what: str
) -> None:
    root, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    elsewhere.mkdir()
    make_bundle(root, 2)
    bad = make_bundle(root, 4)
    truncate(bad / "policy" / "model.pt")
    make(root / layout.QUARANTINE_DIR, elsewhere)
    before = tree(root)

    dry = plan_resume(root, tidy=False)  # a look (preflight --dry-run) moves nothing: nothing to refuse
    assert dry.decision == "resume" and dry.step == 2

    plan = plan_resume(root)
    assert plan.decision == "refuse" and "quarantine" in plan.reason and what in plan.reason, plan.reason
    assert tree(root) == before and list(elsewhere.iterdir()) == [], "nothing moved, nothing written elsewhere"
    assert main(["preflight", "--checkpoint-dir", str(root)]) == 2


def test_a_linked_tmp_dir_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    make_bundle(root, 2)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    (root / layout.tmp_name(4)).symlink_to(elsewhere, target_is_directory=True)
    plan = plan_resume(root)
    assert plan.decision == "resume" and plan.quarantined == []
    assert (root / layout.tmp_name(4)).is_symlink() and (elsewhere / "precious").exists()


def test_a_reason_file_is_never_written_through_a_planted_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ckpt"
    make_bundle(root, 2)
    bad = make_bundle(root, 4)
    truncate(bad / "policy" / "model.pt")
    monkeypatch.setattr("sc_app.checkpoint.quarantine.utc_stamp", lambda: "T")
    (root / layout.QUARANTINE_DIR).mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (root / layout.QUARANTINE_DIR / "step_4.T.reason.txt").symlink_to(victim)
    plan = plan_resume(root)
    assert plan.decision == "resume" and plan.step == 2
    assert victim.read_text() == "keep me"
    assert (root / layout.QUARANTINE_DIR / "step_4.T.2").is_dir()


def test_ckpt_verify_takes_bundle_names_not_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_bundle(tmp_path / "ckpt", 2)
    shutil.copytree(tmp_path / "ckpt" / "step_2", tmp_path / "step_9")
    assert main(["ckpt", "verify", "--checkpoint-dir", str(tmp_path / "ckpt"), "../step_9"]) == 2
    err = capsys.readouterr().err
    assert "not a bundle name" in err and "Traceback" not in err
