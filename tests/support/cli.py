"""``sc-app`` in the test's own process: ``main(argv)`` with its stdout and stderr captured (``capfd``: what a
subprocess would have printed, file-descriptor level included), its environment set through ``monkeypatch`` and
undone after the call, and a check that the call left nothing behind in the process the next test runs in.

A refusal costs milliseconds here instead of an interpreter start (seconds on a loaded 2-core machine). What needs
a process of its own — Ray, signals, ``os._exit``, the real entry point — stays on ``tests.support.proc``; one
subprocess per command family (``tests/e2e/test_cli_smoke.py``) keeps the entry point and "no traceback" proven.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pytest

from sc_app.cli import main

ERROR = "sc-app: error:"
# The handlers a command may install (``sc-app run`` takes SIGTERM); restored after every call.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
TMP = os.path.realpath(tempfile.gettempdir()) + os.sep


@dataclass(frozen=True)
class Ran:
    """How one in-process command ended: its exit code and what it printed."""

    rc: int
    stdout: str
    stderr: str

    @property
    def out(self) -> str:
        """Both streams, as ``tests.support.proc.Finished.out`` has them (stderr last)."""
        return self.stdout + self.stderr

    def errors(self, prefix: str = ERROR) -> list[str]:
        """The error lines (``<prog>: error: ...``) on stderr."""
        return [line for line in self.stderr.splitlines() if line.startswith(prefix)]


def _fds() -> set[str]:
    """This process's descriptors open on files under the temp dir, where every test keeps its checkpoint dirs,
    logs and configs (``fd -> path``). Not the rest: a library's own caches (matplotlib keeps its fonts open, the
    kubernetes client its cgroup files) and the sockets an API-server stand-in in the test's process accepts."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(TMP) and "/site-packages/" not in target:  # a venv may live under it
                out.add(f"{fd} -> {target}")
    return out


@contextlib.contextmanager
def left_alone(grace: float = 5.0) -> Iterator[None]:
    """Undo what a command may change in its process (cwd, the root logger, signal handlers); fail if it leaves
    what cannot be undone: a thread (still running ``grace`` s later), a file it opened and kept open (``_fds``), an
    initialised Ray (one the test process had before, such as the suite's ``local_ray``, is not the command's)."""
    ray_before = _ray_initialised()
    cwd, root = os.getcwd(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    signals = {s: signal.getsignal(s) for s in SIGNALS}
    threads, fds = set(threading.enumerate()), _fds()
    try:
        yield
    finally:
        os.chdir(cwd)
        root.handlers[:] = handlers
        root.setLevel(level)
        for s, handler in signals.items():
            signal.signal(s, handler)
    deadline = time.monotonic() + grace  # a thread a command stopped may take a moment to end
    while (extra := set(threading.enumerate()) - threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not extra, f"the command left threads running: {sorted(t.name for t in extra)}"
    assert _fds() <= fds, f"the command left file descriptors open: {sorted(_fds() - fds)}"
    assert ray_before or not _ray_initialised(), "the command started Ray in the test process"


def _ray_initialised() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@dataclass
class InProcess:
    """``cli("ckpt", "list", ...)``: ``sc_app.cli.main`` on those arguments, in this process (the ``cli`` fixture).
    ``within`` runs it on a thread and fails if it has not returned by then (a hang); only for commands that take
    no signal handler (``signal.signal`` works on the main thread only)."""

    capfd: pytest.CaptureFixture[str]
    monkeypatch: pytest.MonkeyPatch

    def __call__(self, *args: str, env: Mapping[str, str] | None = None, within: float | None = None) -> Ran:
        with self.monkeypatch.context() as mp:
            for key, value in (env or {}).items():
                mp.setenv(key, value)
            self.capfd.readouterr()  # what the test printed before is not the command's
            with left_alone():
                rc = main(list(args)) if within is None else _bounded(list(args), within)
            out, err = self.capfd.readouterr()
        return Ran(rc, out, err)


def _bounded(argv: list[str], within: float) -> int:
    box: list[int] = []
    worker = threading.Thread(target=lambda: box.append(main(argv)), name="sc-app main", daemon=True)
    worker.start()
    worker.join(within)
    assert not worker.is_alive(), f"sc-app {' '.join(argv)} still running after {within}s: a hang"
    assert box, f"sc-app {' '.join(argv)} raised instead of returning an exit code"
    return box[0]


def refused(ran: Ran, code: int, *named: str, prefix: str = ERROR) -> str:
    """``ran`` ended with ``code`` and exactly one error line on stderr naming each of ``named``, no traceback on
    either stream; that line."""
    errors = ran.errors(prefix)
    assert ran.rc == code, (ran.rc, ran.out[-3000:])
    assert len(errors) == 1 and all(n in errors[0] for n in named), ran.out[-3000:]
    assert "Traceback" not in ran.out, ran.out[-3000:]
    return errors[0]
