"""Stop requests through the checkpoint volume: how ``sc-app stop`` (a pod's preStop hook, an operator) reaches
the driver that holds the directory's lease, with no Kubernetes API and no Ray connection.

``<root>/STOP`` names the lease it is addressed to (run id + epoch). The holder's driver polls it and, when it is
addressed to itself, stops gracefully (finish the step, cut a bundle of it, release the lease, exit 143). A
request addressed to an earlier holder (left behind by a preempted attempt) is inert: a retry never stops
because of it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sc_app.checkpoint.lease import LeaseRecord
from sc_app.io import strict_json
from sc_app.io.durable import utc_stamp, write_durable
from sc_app.io.safe_files import read_optional

STOP_FILE = "STOP"
MAX_STOP_BYTES = 16 * 1024


@dataclass(frozen=True)
class StopRequest:
    run_id: str
    fencing_epoch: int  # of the lease it is addressed to (the JSON field is "epoch")
    requested_at: str
    by: str  # host:pid of whoever asked

    def addressed_to(self, run_id: str, fencing_epoch: int) -> bool:
        """For run ``run_id`` that took the lease at ``fencing_epoch``: at that epoch or a later one of the same run
        (an in-job restore moves the run's epoch on)."""
        return self.run_id == run_id and self.fencing_epoch >= fencing_epoch


def request_stop(root: Path, holder: LeaseRecord) -> StopRequest:
    """Ask the run holding ``holder``'s lease to stop (durably written before this returns)."""
    request = StopRequest(holder.run_id, holder.fencing_epoch, utc_stamp(), f"{socket.gethostname()}:{os.getpid()}")
    doc = asdict(request)
    doc["epoch"] = doc.pop("fencing_epoch")  # the on-disk name
    write_durable(Path(root) / STOP_FILE, (json.dumps(doc) + "\n").encode())
    return request


def read_stop_request(root: Path) -> StopRequest | None:
    """The request on the volume, or None (none, or not a request this sc-app wrote: it is ignored)."""
    path = Path(root) / STOP_FILE
    try:
        raw = read_optional(path, MAX_STOP_BYTES)  # regular files only: a FIFO there never blocks the run
        if raw is None:
            return None
        doc = strict_json.parse(raw)
        epoch = doc["epoch"]
        if type(epoch) is not int:  # no coercion: 2.0, "2" or true address no lease
            return None
        return StopRequest(str(doc["run_id"]), epoch, str(doc["requested_at"]), str(doc["by"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class StopWatch:
    """Polls ``<root>/STOP`` for a request addressed to one lease, at most every ``period`` seconds."""

    def __init__(self, root: Path, run_id: str, fencing_epoch: int, period: float = 1.0) -> None:
        self.root, self.run_id, self.fencing_epoch, self.period = Path(root), run_id, fencing_epoch, period
        self._next = 0.0
        self._seen: StopRequest | None = None

    def requested(self) -> StopRequest | None:
        now = time.monotonic()
        if self._seen is None and now >= self._next:
            self._next = now + self.period
            request = read_stop_request(self.root)
            if request is not None and request.addressed_to(self.run_id, self.fencing_epoch):
                self._seen = request
        return self._seen
