"""Issue 22, class B: every reader of a path someone else controls, against every kind of file that is not a small
regular file — a FIFO with no writer (an open for reading would block forever), ``/dev/zero`` behind a link (an
endless read), a directory, a file larger than the reader's bound. Each reader must answer within seconds with one
line naming the path (or, for a stop request, ignore it), never hang, never read without bound.

Each call runs in a daemon thread joined with a timeout: a reader that blocks fails the test instead of hanging it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint.lease import LEASE_FILE, LOCK_FILE, LeaseError, dir_lock, read_lease
from sc_app.checkpoint.lineage import LINEAGE_FILE, LineageError, read_lineage
from sc_app.checkpoint.stop_request import STOP_FILE, read_stop_request
from sc_app.config.app import ConfigError, load_config
from sc_app.io.safe_files import FileProblem
from sc_app.observe.reader import read_history
from sc_app.observe.records import LOG_FILE
from sc_app.rl.hf.dataset import DatasetError, load_jsonl
from sc_app.rl.hf.model_dir import ModelDirError, check_model_dir

BOUND_S = 20.0


def bounded(fn: Callable[[], Any]) -> Any:
    """``fn()``'s result or exception, failing the test when it does not return within ``BOUND_S``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(BOUND_S)
    assert not t.is_alive(), f"the reader hung for {BOUND_S}s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def hostile(path: Path, kind: str) -> None:
    """Put ``kind`` at ``path``: fifo, zero (a link to /dev/zero), dir, big (a regular file of 200 MiB, sparse)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    elif kind == "big":
        with open(path, "wb") as f:
            f.truncate(200 * 1024 * 1024)
    else:
        raise AssertionError(kind)


KINDS = ["fifo", "zero", "dir", "big"]


def one_line(exc: BaseException, *named: str) -> str:
    text = str(exc)
    assert "\n" not in text and all(n in text for n in named), text
    return text


@pytest.mark.parametrize("kind", KINDS)
def test_lease(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / LEASE_FILE, kind)
    with pytest.raises(LeaseError) as info:
        bounded(lambda: read_lease(tmp_path))
    one_line(info.value, LEASE_FILE, "move it aside")


@pytest.mark.parametrize("kind", KINDS)
def test_lineage(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / LINEAGE_FILE, kind)
    with pytest.raises(LineageError) as info:
        bounded(lambda: read_lineage(tmp_path))
    one_line(info.value, LINEAGE_FILE)


@pytest.mark.parametrize("kind", KINDS)
def test_stop_request_is_ignored(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / STOP_FILE, kind)
    assert bounded(lambda: read_stop_request(tmp_path)) is None


@pytest.mark.parametrize("kind", ["fifo", "dir", "zero"])
def test_lock_file(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / LOCK_FILE, kind)

    def lock() -> None:
        with dir_lock(tmp_path):
            pass

    with pytest.raises(LeaseError) as info:
        bounded(lock)
    one_line(info.value, LOCK_FILE)


@pytest.mark.parametrize("kind", KINDS)
def test_config_file(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / "job.yaml", kind)
    with pytest.raises(ConfigError) as info:
        bounded(lambda: load_config(tmp_path / "job.yaml"))
    one_line(info.value, "job.yaml")


@pytest.mark.parametrize("kind", KINDS)
def test_task_path(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / "train.jsonl", kind)
    with pytest.raises(DatasetError) as info:
        bounded(lambda: load_jsonl(tmp_path / "train.jsonl"))
    one_line(info.value, "task.path", "train.jsonl")


@pytest.mark.parametrize("kind", KINDS)
def test_model_config(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / "config.json", kind)
    with pytest.raises(ModelDirError) as info:
        bounded(lambda: check_model_dir(tmp_path))
    one_line(info.value, "config.json")


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_run_log(tmp_path: Path, kind: str) -> None:
    hostile(tmp_path / LOG_FILE, kind)
    with pytest.raises(FileProblem) as info:
        bounded(lambda: read_history(tmp_path))
    one_line(info.value, LOG_FILE)


def test_a_run_log_line_without_end_is_skipped_not_held(tmp_path: Path) -> None:
    with open(tmp_path / LOG_FILE, "wb") as f:
        f.write(b'{"v":1,"kind":"event"' + b" " * (3 << 20) + b"\n")  # 3 MiB on one line
    history = bounded(lambda: read_history(tmp_path))
    assert history.skipped == 1 and not history.steps and not history.events


def test_a_lease_whose_ttl_never_ends_is_not_a_lease(tmp_path: Path) -> None:
    import json

    (tmp_path / LEASE_FILE).write_text(
        json.dumps(
            {"run_id": "r", "epoch": 1, "host": "h", "pid": 1, "acquired_at": "x", "heartbeat_at": 0.0, "ttl_s": 1e300}
        )
    )
    with pytest.raises(LeaseError) as info:
        read_lease(tmp_path)
    one_line(info.value, "ttl_s")
