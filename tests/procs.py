"""Process helpers for end-to-end tests: run the real CLI in its own session and clean up all it started.

Every run is started with ``start_new_session=True``; ``kill_session`` SIGKILLs that session's processes only
(Ray workers included), never anything another test or engineer started — and never ``ray stop``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SC_APP = [sys.executable, "-m", "sc_app"]
RUN_TIMEOUT = 300


def session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != sid:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError, PermissionError, IndexError):
            continue
        if state != "Z":
            found.append(pid)
    return found


def kill_session(sid: int, timeout: float = 30.0) -> None:
    """SIGKILL the process group, then any straggler of the same session (Ray workers get their own groups)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        members = session_members(sid)
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    raise AssertionError(f"processes of session {sid} survived SIGKILL: {session_members(sid)}")


@dataclass
class Finished:
    rc: int
    out: str


def sc_app(*args: str, timeout: float = RUN_TIMEOUT, env: dict[str, str] | None = None) -> Finished:
    """Run the CLI to completion in its own session; whatever it leaves behind is killed afterwards."""
    proc = subprocess.Popen(
        [*SC_APP, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"sc-app {' '.join(args)} timed out after {timeout}s:\n{out[-4000:]}") from None
    finally:
        kill_session(proc.pid)
    return Finished(proc.returncode, out)


def start_sc_app(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the CLI in its own session with output to ``log``; the caller must ``kill_session(proc.pid)``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*SC_APP, *args],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_trace(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by SIGKILL
            continue
    return events


def load_sidecar(path: Path) -> dict[str, Any]:
    import torch

    sd = torch.load(path, map_location="cpu", weights_only=True)
    assert isinstance(sd, dict)
    return sd
