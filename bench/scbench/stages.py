"""The CPU cost of each stage a save or restore is made of, alone, on one thread: CPU-ms per MiB
(``time.thread_time``: user + system time of the measuring thread, so kernel copies into the page cache count).

Stages: sha256 and blake3 over a buffer (``sc_app.io.hashing``); a memory copy (what TransferQueue's packing of rows
into one tensor costs); a write + fsync of the buffer into the page cache; the same write hashed by
``hashing.HashingWriter`` in the same pass (chunk written, then hashed while in cache) against written then
hashed in a second pass over the whole buffer (what ``PartWriter`` did before); a read with the page cache dropped.
Repetitions interleave the stages; each figure is the median.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scbench.common import MiB, drop_cache


def _cpu_ms(fn: Callable[[], Any]) -> float:
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def _write(path: Path, data: memoryview, hasher: Any = None, same_pass: bool = False) -> None:
    from sc_app.io import hashing

    with open(path, "wb", buffering=0) as raw:
        if same_pass:
            hashing.HashingWriter(raw).write(data)
        else:
            view = data
            while view.nbytes:
                view = view[raw.write(view) :]
            if hasher is not None:
                hasher.update(data)
        os.fsync(raw.fileno())


def _read(path: Path) -> None:
    buf = bytearray(8 * MiB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def stage_costs(work: Path, mib: int, reps: int) -> dict[str, Any]:
    """CPU-ms per MiB of each stage over a buffer of ``mib`` MiB of random bytes, written under ``work``."""
    import blake3

    data = memoryview(os.urandom(mib * MiB))
    path = work / "stage.bin"
    stages: dict[str, Callable[[], Any]] = {
        "sha256": lambda: hashlib.sha256(data).digest(),
        "blake3": lambda: blake3.blake3(data).digest(),
        "memcpy": lambda: bytearray(data),
        "write_fsync": lambda: _write(path, data),
        "write_then_sha256": lambda: _write(path, data, hashlib.sha256()),
        "write_then_blake3": lambda: _write(path, data, blake3.blake3()),
        "write_blake3_same_pass": lambda: _write(path, data, same_pass=True),
        "read_cold": lambda: (drop_cache([path]), _read(path)),
    }
    samples: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(reps):
        for name, fn in stages.items():
            samples[name].append(_cpu_ms(fn) / mib)
    path.unlink(missing_ok=True)
    return {
        "mib": mib,
        "reps": reps,
        "cpu_ms_per_mib": {name: statistics.median(v) for name, v in samples.items()},
        "all": samples,
    }
