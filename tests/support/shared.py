"""Something expensive (a real run) built once per test session and shared by every xdist worker.

Under pytest-xdist each worker is a process of its own, so a session fixture alone would build once per worker. The
first worker to ask builds under a file lock in the session's base temp dir (the parent of every worker's basetemp,
the pattern of pytest-xdist's docs) and records the result there; the others wait on the lock and load it. A build
that failed is not repeated: the other workers fail with its message — unless Ray could not start in time
(``RayDidNotStart``: an overloaded machine), which leaves nothing behind, so the rerun of the test, or another
worker, builds it again. In one process it is simply built.
"""

from __future__ import annotations

import os
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

from tests.support.proc import RayDidNotStart

T = TypeVar("T")


def built_once(
    factory: pytest.TempPathFactory,
    name: str,
    build: Callable[[Path], T],
    save: Callable[[T, Path], None],
    load: Callable[[Path], T],
) -> T:
    """``build(dir)`` once per session (``dir`` new and empty), ``save``d to a file the other workers ``load``."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(factory.mktemp(name))
    root = factory.getbasetemp().parent
    done, failed = root / f"{name}.json", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if done.exists():
            return load(done)
        if failed.exists():
            pytest.fail(f"building {name} failed in another worker:\n{failed.read_text()}")
        base = root / name
        base.mkdir()
        try:
            built = build(base)
        except RayDidNotStart:
            shutil.rmtree(base, ignore_errors=True)
            raise
        except BaseException:
            failed.write_text(traceback.format_exc()[-6000:])
            raise
        save(built, done)
        return built
