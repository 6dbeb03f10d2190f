"""``task.reward``'s module imported once in a child process before the driver imports it.

Importing runs the user's code: a module that calls ``os._exit(0)`` would end the driver with exit 0 and nothing
done, one that loops would hang it, one that segfaults would kill it without a word. The child takes those, and
the driver reports them in one line (``RewardError``, exit 2) before Ray starts. Only a child that imported the
module, checked the function and said so lets the driver import it itself.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sc_app.rl.hf.rewards import BUILTIN, RewardError

PROBE_SECONDS = 120.0
_OK = "sc-app-reward-probe: ok"
_CHILD = (
    "import sys\n"
    "from sc_app.rl.hf.rewards import RewardError, resolve_reward\n"
    "try:\n"
    "    resolve_reward(sys.argv[1])\n"
    "except RewardError as exc:\n"
    "    print(exc, file=sys.stderr, flush=True)\n"
    "    sys.exit(3)\n"
    f"print({_OK!r}, flush=True)\n"
)


def probe_reward(spec: str, timeout: float = PROBE_SECONDS) -> None:
    """``RewardError`` unless a child process imports ``spec``'s module and finds the function callable."""
    if spec in BUILTIN:
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)  # what this process can import
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, spec],
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RewardError(
            f"task.reward {spec!r}: importing its module took more than {timeout:g} s (a loop at import time?)"
        ) from None
    if done.returncode == 0 and _OK in done.stdout:
        return
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    if done.returncode == 3 and lines:
        raise RewardError(lines[-1])
    how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
    said = f": {lines[-1][:200]}" if lines else ""
    raise RewardError(
        f"task.reward {spec!r}: importing its module ended the process ({how}) before the function could be "
        f"checked{said}; a reward module must not exit or crash on import"
    )
