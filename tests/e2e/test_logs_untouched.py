"""Nothing that tidies a checkpoint directory touches the run log in ``<checkpoint.dir>/logs``.

Every path that moves or deletes inside a checkpoint directory is exercised with a ``logs/`` beside the bundles:
preflight's quarantine of a leftover and of a bundle that fails verification (``plan_resume(tidy=True)``, also
through the CLI), retention after a save (``prune(newest_verified=...)``), ``sc-app ckpt prune``, and a writer
that moves an abandoned ``tmp_step_N`` of its own step aside. ``logs/`` must come out byte for byte the same.
"""

from __future__ import annotations

from pathlib import Path

from sc_app.checkpoint import BundleWriter, layout, plan_resume, prune
from sc_app.observe.records import DEFAULT_LOG_SUBDIR, LOG_FILE
from tests.support.bundles import make_bundle, make_tmp_leftover, tree
from tests.support.cli import InProcess


def with_logs(root: Path) -> tuple[Path, dict[str, str]]:
    logs = root / DEFAULT_LOG_SUBDIR
    logs.mkdir(parents=True)
    (logs / LOG_FILE).write_text('{"v":1,"kind":"event"}\n' * 3)
    (logs / "events.out.tfevents.1.host.1.0").write_bytes(b"\x00" * 64)
    (logs / "report").mkdir()
    (logs / "report" / "reward_loss.png").write_bytes(b"\x89PNG")
    return logs, tree(logs)


def damaged_newest(root: Path) -> None:
    for step in (2, 4, 6, 8):
        make_bundle(root, step)
    (root / "step_8" / layout.LOADER_FILE).write_bytes(b"torn")
    make_tmp_leftover(root, 10)


def test_preflight_quarantine_and_retention_leave_logs_alone(tmp_path: Path) -> None:
    damaged_newest(tmp_path)
    logs, before = with_logs(tmp_path)
    plan = plan_resume(tmp_path, tidy=True)
    assert plan.decision == "resume" and plan.step == 6
    assert len(plan.quarantined) == 2  # the leftover and the bad step_8: something was moved
    removed = prune(tmp_path, 1, newest_verified=tmp_path / "step_6")
    assert removed == ["step_4", "step_2"]
    assert tree(logs) == before


def test_a_writer_moving_its_own_abandoned_tmp_leaves_logs_alone(tmp_path: Path) -> None:
    make_tmp_leftover(tmp_path, 4)
    logs, before = with_logs(tmp_path)
    BundleWriter(tmp_path, 4).begin()
    assert (tmp_path / layout.QUARANTINE_DIR).is_dir()
    assert tree(logs) == before


def test_the_cli_tidying_commands_leave_logs_alone(cli: InProcess, tmp_path: Path) -> None:
    damaged_newest(tmp_path)
    logs, before = with_logs(tmp_path)
    for args in (
        ["preflight", "--checkpoint-dir", str(tmp_path), "--json"],
        ["ckpt", "prune", "--checkpoint-dir", str(tmp_path), "--keep", "1"],
        ["ckpt", "verify", "--checkpoint-dir", str(tmp_path)],
        ["ckpt", "list", "--checkpoint-dir", str(tmp_path)],
    ):
        done = cli(*args)
        assert done.rc == 0, done.out
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == ["step_6"]
    assert tree(logs) == before
