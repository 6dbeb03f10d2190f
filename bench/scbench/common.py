"""What every section shares: constants, correctness checks, statistics, raw disk baselines, and the harness (one
local Ray + one TransferQueue for the whole run, re-initialised when a section needs another storage-unit count)."""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]

MiB = 1024 * 1024
KiB = 1024
ROW_BYTES = 1 * MiB  # data-plane rows of the snapshot sections (the "1 MiB rows")
GROUP = 8  # rows per group in the snapshot and throughput sections
FULL_SIZES_MIB = [16, 64, 256, 1024]
QUICK_SIZES_MIB = [16]
TWO_UNIT_MAX_MIB = 256  # the 2-unit snapshot comparison runs up to this size
NATIVE_MAX_MIB = 256  # native saves above this are skipped: its bundle is ~8x the live bytes (and as much RAM)
STREAM_GROUP_BYTES = 8 * 1024  # a streaming rollout group during a save: 8 rows x 1 KiB
STREAM_INTERVAL_S = 0.005  # one streaming commit every 5 ms while a save runs
DEFAULT_SAVE_PERIOD = 10
# the "before" of the before/after columns: the code as it was when issue 12 was opened
BEFORE_COMMIT = "7e36903"


class BenchError(AssertionError):
    """A benchmark produced a wrong result (not a slow one): the run fails."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise BenchError(what)


# ------------------------------------------------------------------------------------------------ statistics
def summary(xs: list[float]) -> dict[str, float]:
    """median, min, max, n of a sample."""
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def rate(nbytes: float, secs: list[float]) -> dict[str, float]:
    """MiB/s of ``nbytes`` moved in each of ``secs``."""
    return summary([nbytes / s / MiB for s in secs])


# ------------------------------------------------------------------------------------------------ raw I/O
_PATTERN = os.urandom(8 * MiB)


def drop_cache(paths: list[Path]) -> None:
    """Evict files from the page cache (POSIX_FADV_DONTNEED) so reads hit the disk, for both sides alike."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in files_under(d))


def raw_write(path: Path, nbytes: int, pattern: bytes | None = None) -> float:
    """Sequential write of ``nbytes`` (``pattern`` repeated; 8 MiB of random bytes by default) + fsync (file and
    directory); seconds."""
    pattern = _PATTERN if pattern is None else pattern
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = min(left, len(pattern))
            f.write(memoryview(pattern)[:n])
            left -= n
        os.fsync(f.fileno())
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def raw_read(path: Path) -> float:
    """Sequential read of a whole file (page cache dropped first); seconds."""
    drop_cache([path])
    buf = bytearray(8 * MiB)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def load_avg() -> float:
    return os.getloadavg()[0]


# Top-level modules that moved into packages by concern since older BEFORE_COMMITs (old name -> today's path).
MOVED = {
    "job": "attempt.run", "driver": "attempt.setup", "drive": "attempt.poll",
    "in_job_restore": "attempt.in_job_restore", "actor_watch": "attempt.actor_watch",
    "cluster_fit": "attempt.cluster_fit", "controller": "controller.actor", "controller_saves": "controller.saves",
    "controller_recovery": "controller.recovery", "barrier": "data_plane.barrier",
    "replay_buffer": "data_plane.replay_buffer", "replay_index": "data_plane.replay_index", "config": "config.app",
    "config_tree": "config.tree", "config_input": "config.input", "engine_config": "config.engine",
    "safe_files": "io.safe_files", "durable_io": "io.durable", "hashing": "io.hashing", "digest": "io.digest",
    "strict_json": "io.strict_json", "torch_io": "io.torch_files", "background": "io.background",
}  # fmt: skip
MOVED_RE = re.compile(r"\bsc_app\.(" + "|".join(sorted(MOVED, key=len, reverse=True)) + r")\b")


def before_module(path: str, commit: str = BEFORE_COMMIT) -> ModuleType | None:
    """``path`` (a module of this repo) as it was at ``commit``, imported under a private name; None when
    the checkout has no git history to read it from (the before/after columns are then left out)."""
    try:
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}:{path}"],
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    source = MOVED_RE.sub(lambda m: "sc_app." + MOVED[m.group(1)], source)  # its imports, in today's layout
    name = "sc_bench_before_" + path.replace("/", "_").removesuffix(".py")
    file = Path(tempfile.mkdtemp(prefix="sc-bench-before-")) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ the harness
class Harness:
    """One local Ray and one TransferQueue for every section; the results document they fill."""

    def __init__(self, out: Path, work: Path, quick: bool) -> None:
        self.out = out
        self.work = work
        self.quick = quick
        self.sizes = QUICK_SIZES_MIB if quick else FULL_SIZES_MIB
        self.units = 0
        self.tq: Any = None
        self.results: dict[str, Any] = {
            "quick": quick,
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "load_avg_at_start": load_avg(),
            "config": {
                "row_bytes": ROW_BYTES,
                "group_rows": GROUP,
                "sizes_mib": self.sizes,
                "stream_group_bytes": STREAM_GROUP_BYTES,
                "stream_interval_s": STREAM_INTERVAL_S,
                "default_save_period": DEFAULT_SAVE_PERIOD,
                "before_commit": BEFORE_COMMIT,
            },
        }

    def start(self) -> None:
        import ray

        t0 = time.perf_counter()
        logging.getLogger("transfer_queue").setLevel(logging.ERROR)
        from sc_app.attempt.ray_start import start_ray  # a start that times out on a loaded node is retried once

        start_ray(
            lambda: ray.init(
                address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
            ),
            ray.shutdown,
            what="the bench's local Ray",
        )
        t1 = time.perf_counter()
        self.use_units(1)
        # TransferQueue as shipped warns on every put/get where TQ_NUM_THREADS exceeds the cores (the "as shipped"
        # candidate of section 6 brings that path back): keep the run's output readable
        logging.getLogger("transfer_queue.utils.common").setLevel(logging.ERROR)
        self.results["startup"] = {"ray_init_s": t1 - t0, "tq_init_s": time.perf_counter() - t1}

    def use_units(self, units: int) -> None:
        """Make the running TransferQueue have ``units`` storage units (closed and started anew if it differs)."""
        import transfer_queue as tq

        from sc_app.data_plane.transferqueue import tq_conf
        from tests.support.tq import close_transferqueue

        if self.units == units:
            return
        if self.units:
            close_transferqueue(timeout_s=60)
        tq.init(tq_conf(units, None))
        self.tq = tq
        self.units = units

    def stop(self) -> None:
        import ray

        try:
            if self.tq is not None:
                self.tq.close()
        finally:
            ray.shutdown()

    def clear_all(self) -> None:
        for part, rows in self.tq.kv_list().items():
            if rows:
                self.tq.kv_clear(keys=list(rows), partition_id=part)
        check(sum(len(v) for v in self.tq.kv_list().values()) == 0, "data plane not empty after clear")

    def client(self) -> Any:
        """A bootstrap adapter with a fresh guard (own namespace)."""
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        return TransferQueueDataPlane(bootstrap=True, namespace=f"bench-{uuid.uuid4().hex[:8]}")
