"""``LibraryLogs``: library records leave the console for ``libraries.log`` whole; sc-app's stay on the console.

Real ``logging`` on a private root-like logger tree (the process's root is pytest's): a console handler on a
``StringIO``, records from ``ray.*``, ``transfer_queue.*`` and ``sc_app.*`` loggers."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest

from sc_app.observe.library_logs import LIBRARIES_LOG, LibraryLogs, is_library
from tests.support.console import foreign_lines


def _root() -> tuple[logging.Logger, io.StringIO]:
    root = logging.getLogger("h31root")  # stands in for the root: its children below propagate to it
    root.handlers.clear()
    root.setLevel(logging.DEBUG)
    root.propagate = False
    console = io.StringIO()
    handler = logging.StreamHandler(console)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    return root, console


class Named(logging.Filter):
    """The tree under ``h31root`` logs as its real names (``h31root.ray.x`` → ``ray.x``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.name = record.name.removeprefix("h31root.")
        return True


def _log(root: logging.Logger) -> None:
    for name in ("ray.worker", "transfer_queue.interface", "sc_app.attempt.run"):
        logger = logging.getLogger(f"h31root.{name}")
        logger.filters = [Named()]
    logging.getLogger("h31root.ray.worker").warning("Token authentication is enabled.\nSecond line\nThird line")
    try:
        raise RuntimeError("storage unit gone")
    except RuntimeError:
        logging.getLogger("h31root.transfer_queue.interface").exception("Failed to shut down")
    logging.getLogger("h31root.sc_app.attempt.run").warning("one line of sc-app's")


def test_library_records_go_to_the_file_whole_and_the_console_keeps_sc_apps(tmp_path: Path) -> None:
    root, console = _root()
    libraries = LibraryLogs(root).install()
    _log(root)
    assert libraries.open(tmp_path / "logs") == tmp_path / "logs" / LIBRARIES_LOG
    libraries.close()
    out = console.getvalue()
    assert "one line of sc-app's" in out and not foreign_lines(out) and len(out.splitlines()) == 1, out
    written = (tmp_path / "logs" / LIBRARIES_LOG).read_text()
    assert "Token authentication is enabled.\nSecond line\nThird line" in written
    assert "Failed to shut down\nTraceback" in written and "RuntimeError: storage unit gone" in written
    assert [f.__class__ for h in root.handlers for f in h.filters] == [], "the console's handlers as before"


def test_without_a_run_log_each_held_warning_is_one_console_line() -> None:
    root, console = _root()
    libraries = LibraryLogs(root).install()
    _log(root)
    libraries.close()
    lines = console.getvalue().splitlines()
    assert len(lines) == 3 and not any(line[:1].isspace() for line in lines), lines
    assert lines[0].endswith("sc_app.attempt.run: one line of sc-app's")
    assert lines[1].endswith("ray.worker: Token authentication is enabled. (+2 lines)")
    assert "transfer_queue.interface: Failed to shut down (+" in lines[2]


def test_what_counts_as_a_library() -> None:
    def rec(name: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, "f", 1, "m", None, None)

    assert is_library(rec("ray")) and is_library(rec("py.warnings")) and is_library(rec("root"))
    assert is_library(rec("sc_appx")) and not is_library(rec("sc_app")) and not is_library(rec("sc_app.cli.run"))


def test_the_errors_rays_driver_prints_become_library_records(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``(raylet) A worker died ...``: Ray's driver prints what its raylets publish straight to stdout; routed, it is
    a ``ray.raylet`` record in ``libraries.log``, not console output, whatever level the ``ray`` logger has (a
    ``ray.init(logging_level="ERROR")`` earlier in this process sets ERROR); closing puts Ray's printer back."""
    from ray._private import worker

    original = worker.print_to_stdstream
    ray_logger = logging.getLogger("ray")
    monkeypatch.setattr(ray_logger, "propagate", True)  # as sc_app.attempt.run starts Ray
    monkeypatch.setattr(ray_logger, "handlers", [])
    caplog.set_level(logging.ERROR, logger="ray")  # put back after the test
    libraries = LibraryLogs().install()  # the process's root
    libraries.route_ray_errors()
    assert worker.print_to_stdstream is not original
    worker.print_to_stdstream({"lines": ["A worker died or was killed"], "pid": "raylet", "is_err": False}, False)
    libraries.open(tmp_path)
    libraries.close()
    assert worker.print_to_stdstream is original and logging.getLogger("ray.raylet").level == logging.NOTSET
    captured = capfd.readouterr()
    assert "A worker died" not in captured.out + captured.err
    assert "ray.raylet: A worker died or was killed" in (tmp_path / LIBRARIES_LOG).read_text()
