"""Issue 31 G: Ray that cannot start is one line, never Ray's traceback; a start-up timeout is retried once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sc_app.attempt import ray_start
from sc_app.attempt.ray_start import RayStartFailed, RayTmpdirUnusable, check_ray_tmpdir, start_ray
from sc_app.exits import EXIT_BAD_INPUT, EXIT_FAILED, exit_for

TIMEOUT = Exception(
    "The current node timed out during startup. This could happen because some of the raylet failed to startup "
    "or the GCS has become overloaded."
)


class FakeRay:
    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.inits = self.cleanups = 0
        self.slept: list[float] = []

    def init(self) -> None:
        self.inits += 1
        if self.failures:
            raise self.failures.pop(0)

    def cleanup(self) -> None:
        self.cleanups += 1

    def start(self) -> None:
        start_ray(self.init, self.cleanup, what="its embedded node", pause_s=7.0, sleep=self.slept.append)


def test_a_startup_timeout_is_retried_once_after_a_pause_and_a_cleanup() -> None:
    fake = FakeRay(TIMEOUT)
    fake.start()
    assert (fake.inits, fake.cleanups, fake.slept) == (2, 1, [7.0])


def test_a_second_timeout_is_one_line_naming_the_cause() -> None:
    fake = FakeRay(TIMEOUT, TIMEOUT)
    with pytest.raises(RayStartFailed) as failed:
        fake.start()
    assert (fake.inits, fake.cleanups, fake.slept) == (2, 2, [7.0])
    line = str(failed.value)
    assert "\n" not in line and "timed out" in line and "twice" in line and "rerun" in line
    ended = exit_for(failed.value)
    assert ended is not None and ended.code == EXIT_FAILED


@pytest.mark.parametrize(
    "error", [ConnectionError("Could not find any running Ray instance.\nmore"), RuntimeError("raylet died")]
)
def test_another_failure_is_not_retried(error: Exception) -> None:
    fake = FakeRay(error)
    with pytest.raises(RayStartFailed, match=type(error).__name__) as failed:
        fake.start()
    assert (fake.inits, fake.slept) == (1, []) and "\n" not in str(failed.value)


def test_a_sigterm_during_the_start_is_not_swallowed() -> None:
    with pytest.raises(SystemExit):
        FakeRay(SystemExit(15)).start()


def test_a_cleanup_that_fails_does_not_hide_the_cause() -> None:
    def boom() -> None:
        raise RuntimeError("shutdown failed")

    with pytest.raises(RayStartFailed, match="raylet died"):
        start_ray(FakeRay(RuntimeError("raylet died")).init, boom, what="x", sleep=lambda _: None)


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir(mode=0o555)
        return d
    return Path("/proc")  # root writes into any mode; nothing can make a directory in /proc


@pytest.mark.parametrize("case", ["missing", "a-file", "unwritable", "empty"])
def test_an_unusable_ray_tmpdir_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    target = {
        "missing": str(tmp_path / "nope"),
        "a-file": str(tmp_path / "file"),
        "unwritable": str(_unwritable(tmp_path)),
        "empty": "",
    }[case]
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("RAY_TMPDIR", target)
    with pytest.raises(RayTmpdirUnusable, match="RAY_TMPDIR") as refused:
        check_ray_tmpdir()
    assert "\n" not in str(refused.value)
    ended = exit_for(refused.value)
    assert ended is not None and ended.code == EXIT_BAD_INPUT


def test_a_usable_ray_tmpdir_passes_and_keeps_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    check_ray_tmpdir()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("RAY_TMPDIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "nope"))
    assert ray_start.ray_tmpdir() == ("TMPDIR", tmp_path / "nope")  # Ray's own order


def test_a_timeout_is_not_retried_once_a_stop_was_requested() -> None:
    """A SIGTERM while Ray was starting: the first timeout ends the start (the run stops, exit 143) — no pause and
    no second 30 s window on top of the preemption notice."""
    from sc_app.waits import StopCut

    fake = FakeRay(TIMEOUT)
    with pytest.raises(StopCut, match="no retry"):
        start_ray(
            fake.init, fake.cleanup, what="its embedded node", sleep=fake.slept.append, stop_requested=lambda: True
        )
    assert (fake.inits, fake.cleanups, fake.slept) == (1, 1, [])
