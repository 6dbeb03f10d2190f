"""The halves of the in-job restore budget, measured in the bench run that measures the restores
(``bench/chaos.py --in-job --restore warm,...``): actor starts and a raw read of the bundle's bytes.

* **The start of one actor of the kind that died** (``kind_starts``), on a local Ray already up (its start is not
  counted), from the run's config, each to the answer that says it is ready — what a warm restore of that kind must
  start again, alone on the cores:
  - ``trainer.worker``: a new trainer rank, ``.remote()`` to its ``setup`` done (its process, imports, model and
    optimizer built; one rank, no group to form);
  - ``data_plane.controller``, ``data_plane.storage``: TransferQueue, the bootstrap client's start to its answer
    (the controller and the storage units started at once, as a warm restore starts them after either died);
  - ``controller``: the controller actor's process, to the answer of a first call after it imported its module
    (its constructor only stores its arguments; its ``restore`` is the restore's own work).
* **A bare actor's start** (``actor_starts``): a new one-CPU actor that only imports torch and
  ``sc_app.rl.trainer``, to the answer of its first call (the figure the budget used before the kinds').
* **Raw read**: every file of the bundle read sequentially with its page cache dropped first
  (``POSIX_FADV_DONTNEED``, ``bench/scbench/common.raw_read``).
Each is repeated (each start in a new process) and its median kept. Run after the sc-app runs (never beside one: it
would share the cores they are measured on).
"""

from __future__ import annotations

import importlib
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.restore_figures import Budget
from bench.scbench.common import files_under, raw_read

REPO = Path(__file__).resolve().parents[1]
BARE = ("torch", "sc_app.rl.trainer")  # what every restarted sc-app actor imports
CONTROLLER_MODULE = "sc_app.controller.actor"


class _Probe:
    """A fresh actor process paying the imports of ``modules`` before its first call."""

    def __init__(self, modules: Sequence[str]) -> None:
        for name in modules:
            importlib.import_module(name)

    def pid(self) -> int:
        return os.getpid()


@contextmanager
def _local_ray(namespace: str = "sc-app-bench") -> Iterator[None]:
    """A local Ray started as a run starts its own (the job's setup hook: every worker installs
    ``sc_app.compile_marks``), answering before any clock starts; shut down after."""
    import ray

    from sc_app.attempt.ray_start import job_runtime_env

    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    os.environ["PYTHONPATH"] = path
    ray.init(
        num_cpus=4,
        namespace=namespace,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=job_runtime_env({"PYTHONPATH": path}),
    )
    try:
        ray.get(ray.remote(lambda: 0).remote())
        yield
    finally:
        ray.shutdown()


def _timed(reps: int, start: Callable[[], Any], stop: Callable[[Any], None]) -> list[float]:
    """Seconds of ``reps`` starts: ``start()`` returns once the started thing answered; ``stop`` ends it."""
    seconds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        got = start()
        seconds.append(time.perf_counter() - t0)
        stop(got)
    return seconds


def _probe_starts(modules: Sequence[str], reps: int) -> list[float]:
    import ray

    probe = ray.remote(num_cpus=1)(_Probe)
    pids: set[int] = set()

    def start() -> Any:
        actor = probe.remote(list(modules))
        pids.add(ray.get(actor.pid.remote()))
        return actor

    seconds = _timed(reps, start, ray.kill)
    if len(pids) != reps:
        raise RuntimeError(f"{reps} actor starts ran in {len(pids)} processes")
    return seconds


def actor_starts(reps: int = 3) -> list[float]:
    """Seconds of ``reps`` bare actor starts (``BARE`` imported) on a local Ray."""
    with _local_ray():
        return _probe_starts(BARE, reps)


def _trainer_starts(cfg: Any, reps: int) -> list[float]:
    import ray

    from sc_app.rl.trainer import TrainerWorker

    tcfg, cfg_json = cfg.trainer, cfg.model_dump_json()

    def start() -> Any:
        rank = TrainerWorker.options(num_cpus=1, resources=tcfg.resources or None).remote(cfg_json, 0, 1)
        ray.get(rank.setup.remote("", 0))
        return rank

    return _timed(reps, start, ray.kill)


def _data_plane_starts(cfg: Any, reps: int) -> list[float]:
    from sc_app.attempt.data_plane_start import bootstrap_data_plane
    from sc_app.attempt.warm_reset import _wait_gone
    from sc_app.data_plane.transferqueue import shutdown_transferqueue

    def stop(_: Any) -> None:
        shutdown_transferqueue()
        _wait_gone("TransferQueueController", "transfer_queue", 30)  # the next start needs the name free

    return _timed(reps, lambda: bootstrap_data_plane(cfg), stop)


def kind_starts(sets: Sequence[str], reps: int = 3) -> dict[str, float]:
    """The median start of one actor of each fault kind (the module docstring), from the config of the runs
    (``sets``: their ``--set KEY=VALUE``), on one local Ray."""
    from sc_app.config.app import load_config

    cfg = load_config(None, overrides=list(sets))
    with _local_ray(cfg.ray.namespace):
        dp = statistics.median(_data_plane_starts(cfg, reps))
        return {
            "trainer.worker": statistics.median(_trainer_starts(cfg, reps)),
            "data_plane.controller": dp,
            "data_plane.storage": dp,
            "controller": statistics.median(_probe_starts(["torch", CONTROLLER_MODULE], reps)),
        }


def bundle_reads(bundle: Path, reps: int = 3) -> tuple[int, list[float]]:
    """The bundle's bytes and the seconds of ``reps`` raw reads of all of them."""
    files = files_under(bundle)
    return sum(p.stat().st_size for p in files), [sum(raw_read(p) for p in files) for _ in range(reps)]


def measure(bundle: Path, sets: Sequence[str] = (), reps: int = 3) -> Budget:
    nbytes, reads = bundle_reads(bundle, reps)
    bare = statistics.median(actor_starts(reps))
    return Budget(bare, nbytes, statistics.median(reads), kind_starts(sets, reps))
