"""Issue 31 H (rollback part): every operator command that moves into ``quarantine/`` — ``ckpt rollback``,
``preflight``'s tidying, and ``ckpt prune`` beside them — against a ``quarantine`` that is a regular file, a link
(to a directory, dangling) or not writable: one line, exit 2 (prune: unaffected), no traceback, nothing moved. A
pinned bundle that is moved takes its pin along, so the pin never holds the next bundle of that name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sc_app.checkpoint import BundleWriter, layout
from sc_app.checkpoint.retention import pinned
from sc_app.checkpoint.rollback import rollback
from sc_app.checkpoint.selection import BundleRules
from sc_app.cli import main
from tests.support.bundles import flip_byte, make_bundle, make_tmp_leftover, write_contents
from tests.support.bundles import tree as full_tree

KINDS = ["file", "link-to-dir", "dangling-link", "not-writable"]


def _bad_quarantine(root: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    q = root / layout.QUARANTINE_DIR
    if kind == "file":
        q.write_text("not a directory\n")
    elif kind == "link-to-dir":
        (root.parent / "elsewhere").mkdir()
        q.symlink_to(root.parent / "elsewhere", target_is_directory=True)
    elif kind == "dangling-link":
        q.symlink_to(root.parent / "nowhere")
    else:
        q.mkdir()
        q.chmod(0o555)
        if os.geteuid() == 0:  # root writes anyway: make the check see what a non-root user would
            import sc_app.checkpoint.quarantine as quarantine

            real = os.access
            monkeypatch.setattr(
                quarantine.os, "access", lambda p, m: False if Path(p) == q else real(p, m), raising=True
            )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    root.mkdir()
    for step in (2, 4, 6):
        make_bundle(root, step)
    return root


def tree(root: Path) -> dict[str, str]:
    """Every file but the directory lock (taken by the commands that may move)."""
    return {k: v for k, v in full_tree(root).items() if k != ".lease.lock"}


def _one_error_line(err: str, needle: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sc-app: error:") and needle in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_into_an_unusable_quarantine_is_one_line_and_moves_nothing(
    root: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bad_quarantine(root, kind, monkeypatch)
    before = tree(root)
    for dry in ([], ["--dry-run"]):
        assert main(["ckpt", "rollback", "--checkpoint-dir", str(root), "--to", "2", *dry]) == 2
        _one_error_line(capsys.readouterr().err, "quarantine")
        assert tree(root) == before and sorted(p.name for p in root.glob("step_*")) == ["step_2", "step_4", "step_6"]


@pytest.mark.parametrize("kind", KINDS)
def test_preflight_tidy_into_an_unusable_quarantine_refuses_and_moves_nothing(
    root: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(root / "step_6" / layout.LOADER_FILE)  # a bad newest bundle and a leftover: both would be moved
    make_tmp_leftover(root, 8)
    _bad_quarantine(root, kind, monkeypatch)
    before = tree(root)
    assert main(["preflight", "--checkpoint-dir", str(root)]) == 2
    out = capsys.readouterr().out
    decision = [line for line in out.splitlines() if line.startswith("decision:")]
    assert len(decision) == 1 and "refuse" in decision[0] and "quarantine" in decision[0], out
    assert "Traceback" not in out and tree(root) == before
    assert (root / "step_6").is_dir() and (root / "tmp_step_8").is_dir()


@pytest.mark.parametrize("kind", KINDS)
def test_prune_does_not_need_quarantine(
    root: Path, kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _bad_quarantine(root, kind, monkeypatch)
    assert main(["ckpt", "prune", "--checkpoint-dir", str(root), "--keep", "2"]) == 0
    assert "removed step_2" in capsys.readouterr().out
    assert sorted(p.name for p in root.glob("step_*")) == ["step_4", "step_6"]


def test_a_pinned_bundle_takes_its_pin_into_quarantine(root: Path) -> None:
    (root / layout.PINS_DIR).mkdir()
    (root / layout.PINS_DIR / "step_6").write_text("keep: the eval run\n")
    done = rollback(BundleRules.of_dir(root), 4)
    assert len(done.moved) == 1 and done.moved[0].endswith("(with its pin)")
    assert pinned(root) == set(), "the pin must not stay behind"
    moved = [p for p in (root / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and (moved[0].parent / f"{moved[0].name}.pin").read_text() == "keep: the eval run\n"
    w = BundleWriter(root, 6).begin()  # the run trains step 6 again: the new bundle is not pinned by the old pin
    w.commit(write_contents(w, 6))
    assert "step_6" not in pinned(root)


def test_preflight_moving_a_bad_pinned_bundle_takes_its_pin(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (root / layout.PINS_DIR).mkdir()
    (root / layout.PINS_DIR / "step_6").touch()
    flip_byte(root / "step_6" / layout.LOADER_FILE)
    assert main(["preflight", "--checkpoint-dir", str(root)]) == 0
    assert "quarantined step_6" in capsys.readouterr().out
    assert pinned(root) == set() and len(list((root / layout.QUARANTINE_DIR).glob("step_6.*.pin"))) == 1
