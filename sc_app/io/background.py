"""Worker threads for work that runs behind training (checkpoint writes), at a lower CPU priority.

On a machine whose cores training keeps busy, a checkpoint writer that competes at equal priority slows every
step it overlaps; at ``nice`` 10 the kernel gives the training threads the CPU first and the writer the rest.
Per-thread priorities are a Linux feature (``setpriority`` on a thread id); elsewhere the threads run at normal
priority. Lowering a priority never needs privileges; nothing here ever raises one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

BACKGROUND_NICE = 10


def lower_current_thread_priority(nice: int = BACKGROUND_NICE) -> None:
    """Give the calling thread (only) a nice value of at least ``nice``. No-op off Linux or when not allowed."""
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:  # e.g. a sandbox that forbids it: run at normal priority
        log.debug("could not lower thread priority: %s", exc)


def background_executor(name: str, workers: int = 1, nice: int = BACKGROUND_NICE) -> ThreadPoolExecutor:
    """A thread pool whose threads run at nice ``nice`` at least (``BACKGROUND_NICE`` by default)."""
    return ThreadPoolExecutor(
        max_workers=workers, thread_name_prefix=name, initializer=lower_current_thread_priority, initargs=(nice,)
    )


async def run_blocking(executor: Executor | None, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on ``executor`` (None: the loop's default), awaited from the running loop."""
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(fn, *args, **kwargs))
