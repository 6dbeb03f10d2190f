"""Starting (or joining) Ray without Ray's tracebacks: what ``attempt.run.init_ray`` calls around ``ray.init``.

Invariants:
* an embedded start first checks the directory Ray will write its session into (``RAY_TMPDIR``, else ``TMPDIR``,
  else ``/tmp`` — Ray's own order): missing, not a directory, or one a directory cannot be made in is one line
  naming the variable and what to do (``RayTmpdirUnusable``, exit 2), before Ray is asked for anything;
* a start-up that times out ("The current node timed out during startup": a loaded node whose raylet registered
  too late) is retried once, after ``RETRY_PAUSE_S`` to let the load pass, and with Ray's processes of the failed
  try shut down first; Ray 2.60 waits a fixed 30 s for the raylet inside ``ray.init`` (``_private/node.py``), so
  the retry gives it a second, later window — the whole start may take twice that plus the pause;
* any other failure of ``ray.init``, or the second timeout, is one line (``RayStartFailed``, exit 1: a rerun on a
  less loaded node may succeed); Ray's traceback goes to the debug log, never to the terminal.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sc_app.waits import StopCut

log = logging.getLogger(__name__)

TIMEOUT_MARK = "timed out during startup"  # ray._private.node.Node.__init__'s message
RETRY_PAUSE_S = 10.0


SETUP_HOOK = "sc_app.compile_marks.install"


# An embedded node prestarts no workers: they would start without the job's runtime env (its setup hook), so none
# of the job's actors could use them (each ~1 CPU-s, then killed idle).
EMBEDDED_SYSTEM_CONFIG = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}


def job_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The job's runtime env: ``env_vars`` (actors on a running cluster do not inherit this process's environment)
    and a setup hook that has every worker of the job — TransferQueue's actors too, whose classes never import
    sc_app — install ``sc_app.compile_marks`` before it unpickles anything (~1.5 CPU-s less per such process)."""
    env: dict[str, Any] = {"worker_process_setup_hook": SETUP_HOOK}
    if env_vars:
        env["env_vars"] = env_vars
    return env


class RayStartFailed(RuntimeError):
    """Ray could not be started or joined; the message is the one line to print."""


class RayTmpdirUnusable(RayStartFailed):
    """The directory Ray writes its session into cannot be used: bad input (the environment), exit 2."""


def ray_tmpdir() -> tuple[str, Path]:
    """The variable that names Ray's temp directory and the directory (Ray's order: RAY_TMPDIR, TMPDIR, /tmp)."""
    for var in ("RAY_TMPDIR", "TMPDIR"):
        if var in os.environ:
            return var, Path(os.environ[var])
    return "the default temp dir", Path("/tmp")


def check_ray_tmpdir() -> None:
    """``RayTmpdirUnusable`` unless Ray can make its session directory where it will try to."""
    var, where = ray_tmpdir()
    fix = f"point {var} at a writable directory (or unset it)" if var != "the default temp dir" else "fix /tmp"
    if var in os.environ and not os.environ[var]:
        raise RayTmpdirUnusable(f"{var} is set but empty: Ray has nowhere to write its session; {fix}")
    if not where.exists():
        raise RayTmpdirUnusable(f"{var}={where} does not exist: Ray cannot write its session there; {fix}")
    if not where.is_dir():
        raise RayTmpdirUnusable(f"{var}={where} is not a directory: Ray cannot write its session there; {fix}")
    try:  # a probe, not a permission check: root ignores modes, a read-only mount or /proc does not
        probe = tempfile.mkdtemp(prefix=".sc-app-ray-probe-", dir=where)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise RayTmpdirUnusable(f"{var}={where} cannot take Ray's session directory ({why}); {fix}") from None
    shutil.rmtree(probe, ignore_errors=True)


def start_ray(
    init: Callable[[], None],
    cleanup: Callable[[], None],
    *,
    what: str,
    pause_s: float = RETRY_PAUSE_S,
    sleep: Callable[[float], None] = time.sleep,
    stop_requested: Callable[[], bool] = lambda: False,
) -> None:
    """``init()`` (a ``ray.init`` call), retried once after ``cleanup()`` and ``pause_s`` when it timed out during
    start-up — unless a stop was requested meanwhile (``StopCut``: the run stops, nothing trained); any failure
    left is ``RayStartFailed`` naming ``what`` (the embedded node, or the cluster's address)."""
    for attempt in (1, 2):
        try:
            init()
            return
        except Exception as exc:  # ray.init raises bare Exceptions; SystemExit (a SIGTERM) passes through
            log.debug("ray.init failed (try %d)", attempt, exc_info=True)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            _quietly(cleanup)
            if TIMEOUT_MARK in first and attempt == 1 and stop_requested():
                raise StopCut(f"a stop was requested while Ray timed out starting {what}: no retry") from None
            if TIMEOUT_MARK in first and attempt == 1:
                log.warning("Ray timed out starting %s; retrying once in %.0f s (a loaded node?)", what, pause_s)
                sleep(pause_s)
                continue
            if TIMEOUT_MARK in first:
                raise RayStartFailed(
                    f'Ray timed out starting {what} twice ("{first[:200]}"): the node is too loaded for Ray\'s '
                    "processes to start in time; rerun when it is less busy, or give the job more CPUs"
                ) from None
            raise RayStartFailed(
                f"Ray could not start {what} ({type(exc).__name__}: {first[:300]}); fix the cause and rerun "
                "(run.log_level=DEBUG shows Ray's traceback)"
            ) from None


def _quietly(cleanup: Callable[[], None]) -> None:
    try:
        cleanup()
    except Exception:  # what the failed start left may not shut down cleanly either; the retry starts afresh
        log.debug("ray.shutdown after a failed start failed", exc_info=True)
