"""Explicit fault-injection points for the kill-anywhere tests and the kill stress command.

``fault_point("save.policy")`` does nothing unless ``SC_APP_FAULT_AT`` names that point (or ``*``); then it acts
per ``SC_APP_FAULT_ACTION``: ``kill`` (SIGKILL this process — the default), ``raise`` (``InjectedFault``), or
``enospc`` (``OSError(ENOSPC)``, a full disk). ``SC_APP_FAULT_AFTER=N`` lets the first N hits pass.
Zero cost when unset: one dict lookup per point.
"""

from __future__ import annotations

import errno
import logging
import os
import signal

log = logging.getLogger(__name__)

SAVE_POINTS = (
    "save.begin",
    "save.policy",
    "save.loader",
    "save.window",
    "save.snapshot",
    "save.sidecar",
    "save.manifest",
    "save.fsync",
    "save.rename",
    "save.done",
)
_hits: dict[str, int] = {}


class InjectedFault(RuntimeError):
    pass


def fault_point(name: str) -> None:
    target = os.environ.get("SC_APP_FAULT_AT")
    if not target or (target != name and target != "*"):
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] <= int(os.environ.get("SC_APP_FAULT_AFTER", "0")):
        return
    action = os.environ.get("SC_APP_FAULT_ACTION", "kill")
    log.warning("fault injected at %s: %s", name, action)
    if action == "raise":
        raise InjectedFault(f"fault injected at {name}")
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
    marker = os.environ.get("SC_APP_FAULT_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"{name}\n")
    os.kill(os.getpid(), signal.SIGKILL)
