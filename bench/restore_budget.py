"""The two halves of the in-job restore budget, measured in the bench run that measures the restores
(``bench/chaos.py --in-job --restore warm,...``): one actor's start and a raw read of the bundle's bytes.

* **One actor start**: on a local Ray already up (its start is not counted), from ``.remote()`` of a new actor to
  the answer of its first call — a new worker process that imports what a restarted sc-app actor imports (torch and
  ``sc_app.rl.trainer``), one CPU like a trainer rank; repeated, each in a new process, median kept.
* **Raw read**: every file of the bundle read sequentially with its page cache dropped first
  (``POSIX_FADV_DONTNEED``, ``bench/scbench/common.raw_read``), repeated, median kept.
Run after the sc-app runs (never beside one: it would share the cores they are measured on).
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from bench.restore_figures import Budget
from bench.scbench.common import files_under, raw_read

REPO = Path(__file__).resolve().parents[1]


class _Probe:
    """A fresh actor process paying what a restarted sc-app actor pays before its first call: its imports."""

    def __init__(self) -> None:
        import torch  # noqa: F401

        import sc_app.rl.trainer  # noqa: F401

    def pid(self) -> int:
        return os.getpid()


def actor_starts(reps: int = 3) -> list[float]:
    """Seconds of ``reps`` actor starts on a local Ray (started here, not timed, shut down after)."""
    import ray

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        probe = ray.remote(num_cpus=1)(_Probe)
        ray.get(ray.remote(lambda: 0).remote())  # the cluster answers before the clock starts
        seconds, pids = [], set()
        for _ in range(reps):
            t0 = time.perf_counter()
            actor = probe.remote()
            pids.add(ray.get(actor.pid.remote()))
            seconds.append(time.perf_counter() - t0)
            ray.kill(actor)
        if len(pids) != reps:
            raise RuntimeError(f"{reps} actor starts ran in {len(pids)} processes")
        return seconds
    finally:
        ray.shutdown()


def bundle_reads(bundle: Path, reps: int = 3) -> tuple[int, list[float]]:
    """The bundle's bytes and the seconds of ``reps`` raw reads of all of them."""
    files = files_under(bundle)
    return sum(p.stat().st_size for p in files), [sum(raw_read(p) for p in files) for _ in range(reps)]


def measure(bundle: Path, reps: int = 3) -> Budget:
    nbytes, reads = bundle_reads(bundle, reps)
    return Budget(statistics.median(actor_starts(reps)), nbytes, statistics.median(reads))
