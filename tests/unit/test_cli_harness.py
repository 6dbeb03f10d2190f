"""``tests.support.cli.left_alone``, the guard around every in-process ``sc-app`` call: it undoes what a command may
change (signal handlers, the root logger, cwd) and fails on what cannot be undone (a thread, an open file)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.support.cli import left_alone


def test_signal_handlers_logging_and_cwd_are_restored(tmp_path: Path) -> None:
    before = (signal.getsignal(signal.SIGTERM), list(logging.getLogger().handlers), os.getcwd())
    with left_alone():
        signal.signal(signal.SIGTERM, lambda *_: None)
        logging.getLogger().addHandler(logging.NullHandler())
        os.chdir(tmp_path)
    assert (signal.getsignal(signal.SIGTERM), list(logging.getLogger().handlers), os.getcwd()) == before


def test_a_thread_left_running_fails() -> None:
    stop = threading.Event()
    try:
        with pytest.raises(AssertionError, match="left threads running: \\['leaky'\\]"), left_alone(0.1):
            threading.Thread(target=stop.wait, name="leaky", daemon=True).start()
    finally:
        stop.set()


def test_a_file_left_open_fails(tmp_path: Path) -> None:
    fd = -1
    try:
        with pytest.raises(AssertionError, match="left file descriptors open"), left_alone():
            fd = os.open(tmp_path / "held", os.O_CREAT | os.O_WRONLY)
    finally:
        os.close(fd)
