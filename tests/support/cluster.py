"""``ray.cluster_utils.Cluster`` for the multi-node tests, started the way ``sc_app.attempt.ray_start`` starts Ray.

Ray 2.60 waits a fixed 30 s for a new node's raylet to register (``ray._private.node``); on a loaded machine (two
suites on 2 cores) a node can miss that window although nothing is wrong. Each node start that times out is retried
once, after the processes the failed try started are killed and a pause lets the load pass; any other failure, or
a second timeout, is raised as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import psutil
from ray.cluster_utils import Cluster

from sc_app.attempt.ray_start import RETRY_PAUSE_S, TIMEOUT_MARK

T = TypeVar("T")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill(pids: set[int]) -> None:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.kill()
            procs.append(proc)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def retried(start: Callable[[], T], pause_s: float = RETRY_PAUSE_S) -> T:
    """``start()`` (a node start), once more if it timed out during start-up; what the first try left is killed."""
    before = _children()
    try:
        return start()
    except Exception as exc:
        if TIMEOUT_MARK not in str(exc):
            raise
        _kill(_children() - before)
        time.sleep(pause_s)
    return start()


def start_cluster(**head_node_args: Any) -> Cluster:
    """A ``Cluster`` with its head node started (``retried``)."""
    cluster = Cluster()
    retried(lambda: cluster.add_node(**head_node_args))
    return cluster


def add_node(cluster: Cluster, **node_args: Any) -> Any:
    """``cluster.add_node(**node_args)``, ``retried``."""
    return retried(lambda: cluster.add_node(**node_args))
