"""A per-call cost of ``transferqueue`` 0.1.11, removed from this process's TransferQueue client.

Every put and get of TransferQueue's client runs ``limit_pytorch_auto_parallel_threads``, which asks psutil for the
physical core count on each call — it reads the sysfs topology files of every CPU, about 0.3 ms on the 2-core
development VM, a fifth of an 8-row put — and, wherever ``TQ_NUM_THREADS`` (default 8) exceeds the physical cores,
logs a warning on every call. ``install()`` points the client at the same context manager over a core count read
once per process, warning once. Behaviour is otherwise the same: torch's thread count is min(target, cores) for
the call and restored after. Only the exact version it was written against is touched; the storage units (separate
processes TransferQueue starts) keep the original.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger(__name__)

PATCHED_VERSION = "0.1.11"


@functools.cache
def physical_cores() -> int:
    import psutil

    return int(psutil.cpu_count(logical=False) or 1)


@functools.cache
def _warn_once(target: int, cores: int) -> None:
    log.warning("TQ_NUM_THREADS=%d exceeds the %d physical cores; TransferQueue calls use %d", target, cores, cores)


@contextmanager
def limit_threads(target_num_threads: int | None = None, info: str = "") -> Iterator[None]:
    """TransferQueue's ``limit_pytorch_auto_parallel_threads`` with the core count cached."""
    import torch
    from transfer_queue.utils import common

    cores = physical_cores()
    if target_num_threads is None:
        target_num_threads = 16 if cores >= 16 else cores
    if target_num_threads > cores:
        _warn_once(target_num_threads, cores)
        target_num_threads = cores
    try:
        torch.set_num_threads(target_num_threads)
        yield
    finally:
        torch.set_num_threads(common.DEFAULT_TORCH_NUM_THREADS)


limit_threads.sc_app_fastpath = True  # type: ignore[attr-defined]


def install(tq: Any) -> bool:
    """Use ``limit_threads`` in TransferQueue's client of this process; True when installed (or already)."""
    import transfer_queue.client as client

    if getattr(client.limit_pytorch_auto_parallel_threads, "sc_app_fastpath", False):
        return True
    version = getattr(tq, "__version__", None)
    if version != PATCHED_VERSION:
        log.info("transferqueue %s is not %s: its client is left as it is", version, PATCHED_VERSION)
        return False
    client.limit_pytorch_auto_parallel_threads = limit_threads
    return True
