"""Writer fencing: one lease per checkpoint directory, with a run id, an epoch, a heartbeat and a release.

A new run takes the lease with ``epoch = previous + 1``. Every checkpoint write first checks it still holds the
lease, and a bundle is published (tmp → step_N rename) only while holding the directory lock *and* the lease, so
an older attempt that is still dying (a retry started while its pods terminate) can never publish or interleave
after its successor started: it raises ``LeaseLost`` and stops before writing anything further.

Liveness: the holder renews ``heartbeat_at`` every ``ttl_s / 3`` seconds (``LeaseKeeper``) and marks the lease
``released`` when it exits. A lease is *live* while it is not released and its heartbeat is at most ``ttl_s`` old
(clocks of the pods sharing a volume are assumed in sync to well within ``ttl_s``, as NTP keeps them); on the
holder's own host a lease whose process is gone is not live either (a SIGKILLed embedded run frees it at once).
Only a run holding the live lease may move or remove anything in the directory; a command that finds no live
lease (none, released, or expired: its holder died without releasing) may tidy; read-only commands never change
anything.

``<root>/LEASE`` holds one JSON record, bounded whatever the number of attempts: the holder and a summary of the
one before (never a chain). ``<root>/.lease.lock`` is the ``flock`` that serialises takeovers, renewals, releases,
publishes and tmp-dir creation. A LEASE that does not parse is a ``LeaseError`` naming the file and what to do.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sc_app.config.input import MAX_SECONDS
from sc_app.io import strict_json
from sc_app.io.durable import utc_stamp, write_durable
from sc_app.io.safe_files import FileProblem, read_optional

log = logging.getLogger(__name__)

LEASE_FILE = "LEASE"
LOCK_FILE = ".lease.lock"
DEFAULT_TTL_S = 60.0
MAX_LEASE_BYTES = 64 * 1024


class LeaseLost(RuntimeError):
    """Another run took this checkpoint directory; this one must stop writing."""


class LeaseError(ValueError):
    """The LEASE file cannot be read as a lease record; ``str()`` is one line naming the file and what to do."""


class CheckpointDirNotShared(RuntimeError):
    """A process that writes or reads bundles does not see the checkpoint directory the driver took (another disk,
    or none, at that path on its node); ``str()`` is one line naming the process, its host and what to do."""


SHARED_HINT = (
    "every process that writes or reads bundles (the trainer ranks, the controller actor) must see checkpoint.dir: "
    "a volume shared by their nodes, or place them on the driver's node (docs/object-storage.md \"Without a shared "
    "volume\")"
)


def not_shared(who: str, path: Path | str, why: str) -> CheckpointDirNotShared:
    """The error of ``who`` (e.g. "trainer rank 1") not seeing ``path`` on this host: ``why`` says what is missing."""
    return CheckpointDirNotShared(
        f"{who} on host {socket.gethostname()} does not see the run's checkpoint directory ({path}: {why}); "
        f"{SHARED_HINT}"
    )


@dataclass(frozen=True)
class Release:
    """How the holder left: ``outcome`` is done | stopped | unsaved (steps trained that no bundle covers) | failed |
    refused (``sc_app.attempt.run``). A superseded holder writes no release: the lease is no longer its own."""

    at: str
    outcome: str
    final_step: int | None = None
    newest_bundle: str | None = None


@dataclass(frozen=True)
class LeaseRecord:
    run_id: str
    fencing_epoch: int  # the lease's generation (the JSON field is "epoch"); not the dataset's epoch
    host: str
    pid: int
    acquired_at: str
    heartbeat_at: float  # unix seconds
    ttl_s: float
    released: Release | None = None
    previous: dict[str, Any] | None = field(default=None)  # run_id, epoch, host, released: one level, no chain

    def live(self, now: float | None = None) -> bool:
        """Not released, heartbeat at most ``ttl_s`` old, and — when it ran on this host — its process alive."""
        if self.released is not None:
            return False
        if (time.time() if now is None else now) - self.heartbeat_at > self.ttl_s:
            return False
        return self.host != socket.gethostname() or _process_alive(self.pid)

    def summary(self) -> dict[str, Any]:
        """What the next record keeps of this one."""
        return {
            "run_id": self.run_id,
            "epoch": self.fencing_epoch,
            "host": self.host,
            "released": asdict(self.released) if self.released else None,
        }

    def to_json(self) -> bytes:
        doc = asdict(self)
        doc["epoch"] = doc.pop("fencing_epoch")  # the on-disk name
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, path: Path, raw: bytes) -> LeaseRecord:
        """A record from the bytes of ``path``, or ``LeaseError`` naming what is wrong."""

        def bad(why: str) -> LeaseError:
            return LeaseError(
                f"{path}: not a valid lease record ({why}); if no run is writing to {path.parent}, move it aside "
                f"(mv {path} {path}.bad) and rerun"
            )

        if len(raw) > MAX_LEASE_BYTES:
            raise bad(f"{len(raw)} bytes, a lease is under {MAX_LEASE_BYTES}")
        try:
            doc = strict_json.parse(raw)
        except ValueError as exc:  # not JSON, or a key twice (which epoch would count?)
            raise bad(str(exc)) from None
        if not isinstance(doc, dict):
            raise bad("not a JSON object")
        try:
            release = doc.get("released")
            record = cls(
                run_id=_typed(doc, "run_id", str),
                fencing_epoch=_typed(doc, "epoch", int),
                host=_typed(doc, "host", str),
                pid=_typed(doc, "pid", int),
                acquired_at=_typed(doc, "acquired_at", str),
                heartbeat_at=float(_typed(doc, "heartbeat_at", (int, float))),
                ttl_s=float(_typed(doc, "ttl_s", (int, float))),
                released=None if release is None else Release(**_release_fields(release)),
                previous=doc.get("previous") if isinstance(doc.get("previous"), dict) else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise bad(str(exc).strip("'\"")) from None
        if record.fencing_epoch < 1 or not 0 < record.ttl_s <= MAX_SECONDS:
            raise bad(f"epoch must be >= 1 and 0 < ttl_s <= {MAX_SECONDS:g}")
        return record


def _process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, killed but not yet reaped, is not running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):  # no /proc (not Linux) or gone meanwhile
        return os.path.exists(f"/proc/{pid}") or not os.path.isdir("/proc")


def _typed(doc: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in doc:
        raise KeyError(f"'{key}' missing")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"'{key}' is {value!r}")
    return value


def _release_fields(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise TypeError("'released' is not an object")
    out = {"at": _typed(doc, "at", str), "outcome": _typed(doc, "outcome", str)}
    if doc.get("final_step") is not None:
        out["final_step"] = _typed(doc, "final_step", int)
    if doc.get("newest_bundle") is not None:
        out["newest_bundle"] = _typed(doc, "newest_bundle", str)
    return out


@contextmanager
def dir_lock(root: Path) -> Iterator[None]:
    """The directory's ``flock``; only writers take it (it creates ``.lease.lock``)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LeaseError(
            f"{path}: cannot be opened as the directory's lock file ({exc.strerror or exc}); if no run is writing to "
            f"{root}, move it aside (mv {path} {path}.bad) and rerun"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise LeaseError(f"{path}: is not a regular file, so it cannot be the lock; move it aside and rerun")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def read_lease(root: Path) -> LeaseRecord | None:
    """The current record, None when there is none; ``LeaseError`` when LEASE is not a lease record. Read-only."""
    path = Path(root) / LEASE_FILE
    try:
        raw = read_optional(path, MAX_LEASE_BYTES + 1)
    except FileProblem as exc:  # a directory, FIFO, device or link: never opened for reading (it could block)
        raise LeaseError(f"{exc}: not a lease record; move it aside (mv {path} {path}.bad) and rerun") from None
    return None if raw is None else LeaseRecord.parse(path, raw)


def live_holder(root: Path, now: float | None = None) -> LeaseRecord | None:
    """The record of a run that holds the live lease of ``root``, else None. Read-only."""
    record = read_lease(root)
    return record if record is not None and record.live(now) else None


@dataclass(frozen=True)
class Lease:
    """This run's claim on a checkpoint directory (picklable: actors check it before they write)."""

    root: Path
    run_id: str
    fencing_epoch: int  # the LEASE file's "epoch": one more per run that takes the directory

    @classmethod
    def acquire(cls, root: str | Path, run_id: str, *, ttl_s: float = DEFAULT_TTL_S) -> Lease:
        """Take the lease (epoch + 1), whoever holds it: the newest run wins; older ones are fenced off.

        ``LeaseError`` for a LEASE that does not parse (nothing is written then); ``OSError`` when the directory
        cannot be written (no partial file is left behind)."""
        root = Path(root)
        with dir_lock(root):
            current = read_lease(root)
            now = time.time()
            record = LeaseRecord(
                run_id=run_id,
                fencing_epoch=(current.fencing_epoch if current else 0) + 1,
                host=socket.gethostname(),
                pid=os.getpid(),
                acquired_at=utc_stamp(now),
                heartbeat_at=now,
                ttl_s=float(ttl_s),
                previous=current.summary() if current else None,
            )
            write_durable(root / LEASE_FILE, record.to_json())
        return cls(root, run_id, record.fencing_epoch)

    def _current(self) -> LeaseRecord:
        current = read_lease(self.root)
        if current is None or current.run_id != self.run_id or current.fencing_epoch != self.fencing_epoch:
            raise LeaseLost(
                f"checkpoint dir {self.root} was taken over by run {current.run_id if current else None} "
                f"(epoch {current.fencing_epoch if current else None}); this run (epoch {self.fencing_epoch}) stops "
                "writing"
            )
        return current

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this run still holds the lease."""
        self._current()

    def check_seen_by(self, who: str) -> None:
        """In an actor's process, before it writes or reads a bundle: ``CheckpointDirNotShared`` when this host has
        no LEASE at ``root`` (the directory the driver took is not the one this node sees there), ``LeaseLost``
        when another run holds it. Read-only."""
        if read_lease(self.root) is None:
            raise not_shared(who, self.root / LEASE_FILE, "no lease record there")
        self.check()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Directory lock + lease check: the body runs only while this run is the current writer."""
        with dir_lock(self.root):
            self.check()
            yield

    def renew(self) -> None:
        """Move the heartbeat to now; ``LeaseLost`` if another run took the lease meanwhile."""
        with dir_lock(self.root):
            current = self._current()
            write_durable(self.root / LEASE_FILE, replace(current, heartbeat_at=time.time()).to_json())

    def advance(self) -> Lease:
        """The same run's lease one epoch on: every holder of this ``Lease`` (a torn-down job's actors that may
        still be running) is fenced off — their next lease check raises ``LeaseLost`` — while this run goes on
        with the returned one (an in-job restore). ``LeaseLost`` if another run took the lease meanwhile."""
        with dir_lock(self.root):
            current = self._current()
            record = replace(current, fencing_epoch=current.fencing_epoch + 1, heartbeat_at=time.time())
            write_durable(self.root / LEASE_FILE, record.to_json())
        return Lease(self.root, self.run_id, record.fencing_epoch)

    def release(self, outcome: str, *, final_step: int | None = None, newest_bundle: str | None = None) -> bool:
        """Mark the lease released with how this run ended; False (and nothing written) if it was taken over."""
        with dir_lock(self.root):
            try:
                current = self._current()
            except LeaseLost:
                return False
            done = Release(utc_stamp(), outcome, final_step, newest_bundle)
            write_durable(self.root / LEASE_FILE, replace(current, released=done).to_json())
        return True


class LeaseKeeper:
    """Renews a lease's heartbeat every ``ttl_s / 3`` seconds on a daemon thread until ``stop()``.

    A renewal that finds the lease taken over stops renewing and sets ``lost`` (the next save's lease check then
    stops the run); an I/O error is logged and retried at the next tick (the lease expires only after ``ttl_s``)."""

    def __init__(self, lease: Lease, ttl_s: float) -> None:
        self.lease = lease
        self.lost = threading.Event()
        self._lock = threading.Lock()  # a renewal never interleaves with an advance
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(max(0.05, ttl_s / 3),), daemon=True, name="lease")
        self._thread.start()

    def advance(self) -> Lease:
        """``Lease.advance`` of the kept lease; the keeper renews the new one from now on."""
        with self._lock:
            self.lease = self.lease.advance()
            return self.lease

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                with self._lock:
                    self.lease.renew()
            except LeaseLost:
                self.lost.set()
                return
            except OSError as exc:
                log.warning("could not renew the lease of %s: %s", self.lease.root, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
