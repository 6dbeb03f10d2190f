"""Writer fencing: one lease per checkpoint directory, with a run id and a monotonically increasing epoch.

A new run takes the lease with ``epoch = previous + 1``. Every checkpoint write first checks it still holds the
lease, and a bundle is published (tmp → step_N rename) only while holding the directory lock *and* the lease, so
an older attempt that is still dying (a retry started while its pods terminate) can never publish or interleave
after its successor started: it raises ``LeaseLost`` and stops before writing anything further.

``<root>/LEASE`` holds the JSON record; ``<root>/.lease.lock`` is the ``flock`` that serialises takeovers,
publishes and tmp-dir creation.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.durable_io import utc_stamp, write_durable

LEASE_FILE = "LEASE"
LOCK_FILE = ".lease.lock"


class LeaseLost(RuntimeError):
    """Another run took this checkpoint directory; this one must stop writing."""


@contextmanager
def dir_lock(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_lease(root: Path) -> dict[str, Any] | None:
    try:
        return json.loads((root / LEASE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"epoch": -1, "run_id": "<unreadable>"}


@dataclass(frozen=True)
class Lease:
    root: Path
    run_id: str
    epoch: int

    @classmethod
    def acquire(cls, root: str | Path, run_id: str) -> Lease:
        root = Path(root)
        with dir_lock(root):
            current = read_lease(root) or {}
            epoch = max(int(current.get("epoch", 0)), 0) + 1
            record = {
                "run_id": run_id,
                "epoch": epoch,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "acquired_at": utc_stamp(),
                "previous": current or None,
            }
            write_durable(root / LEASE_FILE, (json.dumps(record, indent=2) + "\n").encode())
        return cls(root, run_id, epoch)

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this run still holds the lease."""
        current = read_lease(self.root) or {}
        if current.get("run_id") != self.run_id or current.get("epoch") != self.epoch:
            raise LeaseLost(
                f"checkpoint dir {self.root} was taken over by run {current.get('run_id')} "
                f"(epoch {current.get('epoch')}); this run (epoch {self.epoch}) stops writing"
            )

    @contextmanager
    def held(self) -> Iterator[None]:
        """Directory lock + lease check: the body runs only while this run is the current writer."""
        with dir_lock(self.root):
            self.check()
            yield
