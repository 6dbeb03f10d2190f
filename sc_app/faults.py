"""Explicit fault-injection points for the kill-anywhere tests and the kill stress command.

``fault_point("save.policy")`` does nothing unless ``SC_APP_FAULT_AT`` names that point (or ``*``); then it acts
per ``SC_APP_FAULT_ACTION``: ``kill`` (SIGKILL this process — the default), ``raise`` (``InjectedFault``),
``enospc`` (``OSError(ENOSPC)``, a full disk), or ``delay`` (a slow disk: wait ``SC_APP_FAULT_DELAY_S`` seconds,
default 2, then go on; ``await afault_point(...)`` waits without blocking the event loop).
``SC_APP_FAULT_AFTER=N`` lets the first N hits pass; ``SC_APP_FAULT_EVERY=M`` then fires on every M-th hit only
and ``SC_APP_FAULT_TIMES=K`` at most K times per point (for faults a run is meant to survive: a retried call hits its
point again). ``SC_APP_FAULT_AT`` may name several points, comma-separated. Zero cost when unset: one dict lookup
per point.

The data-plane points (``sc_app/data_plane/transferqueue.py``) are ``dp.put`` (a commit's put), ``dp.write`` (the
advantage write onto existing rows) and ``dp.clear``: there a ``raise`` or ``kill`` comes *after half of the rows
were written or cleared* (``take`` + ``act``), the partial failure in-job recovery must clean up
(``sc_app/data_plane/retry.py``).

Besides the save points, ``restore.policy.<bundle>`` (e.g. ``restore.policy.step_4``) fires in a trainer loading that
bundle's policy: a restore failure verification cannot foresee (a device out of memory, a broken node), for the tests
of the restore-time fallback — a damaged *file* no longer gets that far, verification parses every one.
``restore.warm`` fires on the driver as a warm in-job restore starts resetting the job (``raise``: the fallback to
the full rebuild); ``restore.warm.started`` once it has started actors of its own (a new data plane, the dead ranks'
and engines' successors), which the full rebuild must remove as well.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import time

log = logging.getLogger(__name__)

SAVE_POINTS = (  # in the order a save passes them
    "save.window",
    "save.begin",
    "save.policy",
    "save.loader",
    "save.snapshot",
    "save.sidecar",
    "save.manifest",
    "save.fsync",
    "save.rename",
    "save.done",
)
# a save committed on the bucket (checkpoint.remote.parts=direct): the record's compare-and-swap instead of the rename
BUCKET_SAVE_POINTS = tuple("save.publish" if p == "save.rename" else p for p in SAVE_POINTS)
_hits: dict[str, int] = {}
_fired: dict[str, int] = {}


class InjectedFault(RuntimeError):
    pass


def _due(name: str) -> str | None:
    """The action to take at ``name`` now, or None."""
    target = os.environ.get("SC_APP_FAULT_AT")
    if not target or (target != "*" and name not in target.split(",")):
        return None
    _hits[name] = _hits.get(name, 0) + 1
    past = _hits[name] - int(os.environ.get("SC_APP_FAULT_AFTER", "0"))
    if past <= 0 or past % int(os.environ.get("SC_APP_FAULT_EVERY", "1")):
        return None
    times = os.environ.get("SC_APP_FAULT_TIMES")
    if times is not None and _fired.get(name, 0) >= int(times):
        return None
    _fired[name] = _fired.get(name, 0) + 1
    action = os.environ.get("SC_APP_FAULT_ACTION", "kill")
    log.warning("fault injected at %s: %s", name, action)
    return action


def _delay_s() -> float:
    return float(os.environ.get("SC_APP_FAULT_DELAY_S", "2"))


async def afault_point(name: str) -> None:
    """``fault_point`` for async code: a ``delay`` sleeps this task only."""
    action = _due(name)
    if action == "delay":
        await asyncio.sleep(_delay_s())
    elif action is not None:
        _act(name, action)


def fault_point(name: str) -> None:
    action = _due(name)
    if action == "delay":
        time.sleep(_delay_s())
    elif action is not None:
        _act(name, action)


def take(name: str) -> str | None:
    """The action due at ``name`` now (counted as a hit), or None: for a point whose caller does part of its work
    before failing (``act``); a ``delay`` is the caller's to honour (``delay_s``)."""
    return _due(name)


def delay_s() -> float:
    return _delay_s()


def act(name: str, action: str) -> None:
    """Fail at ``name`` as ``action`` says (``raise``, ``enospc``, ``kill``); a ``delay`` does nothing here."""
    if action != "delay":
        _act(name, action)


def _act(name: str, action: str) -> None:
    if action == "raise":
        raise InjectedFault(f"fault injected at {name}")
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {name})")
    marker = os.environ.get("SC_APP_FAULT_MARKER")
    if marker:
        with open(marker, "a") as f:
            f.write(f"{name}\n")
    os.kill(os.getpid(), signal.SIGKILL)
