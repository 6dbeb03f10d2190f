"""A bundle's parts on a node that has a disk of its own at ``checkpoint.dir`` (``checkpoint.volume: local``).

Save: a trainer rank that does not see the run's directory writes its part of ``policy/`` into
``<dir>/.node_parts/rank_<R>/save/`` on its own disk and reports the files it hashed as it wrote them
(``PolicyPart.staged_on``). The controller actor reads each file back in chunks (``read_chunk``, through Ray) into
the bundle's ``tmp_step_N/policy/`` (``PartFile``: hashed as written, refused when its bytes or size differ from the
writer's record), so the committed bundle holds every part, as on a shared volume; then the part is dropped.
Restore: the driver sends the verified bundle's ``policy/`` the same way, once per node, to one rank there
(``DirView.node``: ranks on one node share its disk), into ``<dir>/.node_parts/restore/``; that rank checks every
digest against the verified manifest, then every rank of the node loads from there, and the copy is dropped.
Nothing under ``.node_parts/`` is ever a bundle, and nothing there outlives the next save of that rank or the next
restore on that node.
"""

from __future__ import annotations

import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sc_app.io import hashing
from sc_app.io.safe_files import Tree, open_regular, show, unsafe_rel

NODE_PARTS_DIR = ".node_parts"
CHUNK = 16 * 1024 * 1024  # bytes per Ray call (the gather keeps controller.gather.AHEAD of them in flight per file)


class PartMismatch(OSError):
    """A gathered or delivered file differs from what its writer hashed: the save fails (or the restore stops);
    nothing is published from it."""


class NodeCopyFailed(RuntimeError):
    """A bundle's ``policy/`` sent to a node for a restore did not arrive intact there: no fault of the bundle (the
    driver verified it); the attempt ends (exit 1) and a rerun sends it again."""


@dataclass(frozen=True)
class PolicyPart:
    """What one trainer rank wrote of a bundle's ``policy/``: policy-dir-relative name → its record, hashed as it
    was written. ``staged_on``: the host whose own disk holds the files (``part_dir``); None when they
    were written into the bundle itself. ``uploaded``: the rank uploaded them to the bucket itself
    (``sc_app.checkpoint.remote.parts``; ``files`` then lists every one, as sent) and freed its disk."""

    files: dict[str, hashing.FileDigest] = field(default_factory=dict)
    staged_on: str | None = None
    staged: dict[str, int] = field(default_factory=dict)  # every file staged there (name → size), hashed or not
    uploaded: bool = False


@dataclass(frozen=True)
class DirView:
    """A trainer rank's answer: whether its node sees the run's checkpoint directory, and which Ray node it is on
    (the ranks of one node share its disk, so a restore sends that node one copy)."""

    sees: bool
    node: str


def away_by_node(views: list[DirView]) -> dict[str, list[int]]:
    """The nodes of ranks that do not see the directory → those ranks (``views[rank]``), in rank order: the first
    of each is the one the node's copy is sent through."""
    away: dict[str, list[int]] = {}
    for rank, view in enumerate(views):
        if not view.sees:
            away.setdefault(view.node, []).append(rank)
    return away


def receive(root: Path, bundle: str, rel: str, offset: int, data: bytes, first: bool = False) -> None:
    """One chunk of ``bundle``'s ``policy/`` sent to this node, written at ``offset`` of ``rel`` (``first``: whatever
    an earlier send left here is removed before); a disk that cannot take it is ``NodeCopyFailed``."""
    where = restore_dir(root)
    try:
        if first:
            fresh(where)
        write_at(where / bundle, rel, offset, data)
    except OSError as exc:
        raise NodeCopyFailed(
            f"{where / bundle / rel} on {socket.gethostname()}: {exc.strerror or exc}; each node whose trainer ranks "
            "do not see checkpoint.dir needs room there for one copy of a bundle's policy/ (the chart's "
            "checkpoint.local.size or sizeLimit)"
        ) from None


def part_dir(root: Path, rank: int) -> Path:
    """Where rank ``rank`` stages its part of a save."""
    return Path(root) / NODE_PARTS_DIR / f"rank_{rank}" / "save"


def restore_dir(root: Path) -> Path:
    """Where a node receives a bundle's ``policy/`` for its ranks' restore (``<restore_dir>/<bundle>/``)."""
    return Path(root) / NODE_PARTS_DIR / "restore"


def fresh(path: Path) -> Path:
    """``path`` as an empty directory (whatever an earlier save or restore left there removed)."""
    clear(path)
    path.mkdir(parents=True)
    return path


def clear(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _checked(rel: str) -> str:
    why = unsafe_rel(rel)
    if why is not None:
        raise PartMismatch(f"part file name {show(rel)} {why}")
    return rel


def list_files(directory: Path) -> dict[str, int]:
    """The regular files under ``directory`` (relative name → size); anything else there is refused."""
    with Tree.open(directory) as tree:
        inv = tree.scan()
    bad = {**inv.odd, **inv.unlisted}
    if bad:
        rel, why = sorted(bad.items())[0]
        raise PartMismatch(f"{directory / rel}: {why}; not sent")
    return dict(sorted(inv.files.items()))


def read_chunk(directory: Path, rel: str, offset: int) -> bytes:
    """``CHUNK`` bytes of ``directory/rel`` from ``offset`` (fewer only at the end of the file)."""
    fd = open_regular(Path(directory) / _checked(rel))
    try:
        return os.pread(fd, CHUNK, offset)
    finally:
        os.close(fd)


def write_at(directory: Path, rel: str, offset: int, data: bytes) -> None:
    """``data`` into ``directory/rel`` at ``offset`` (a chunk of a file being received, in any order)."""
    path = Path(directory) / _checked(rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


class PartFile:
    """One file being received: created (never over an existing one), hashed as written, fsynced on ``close``."""

    def __init__(self, directory: Path, rel: str, alg: str) -> None:
        self.path = Path(directory) / _checked(rel)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._h = hashing.new(alg)
        self.alg, self.size = alg, 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view.nbytes:
            view = view[os.write(self._fd, view) :]
        self._h.update(data)
        self.size += len(data)

    def close(self, expected: hashing.FileDigest | None = None) -> hashing.FileDigest:
        """Fsync and close; with ``expected``, ``PartMismatch`` when the bytes received are not the writer's."""
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
        got = hashing.FileDigest(self.alg, self._h.hexdigest(), self.size)
        if expected is not None and (got.digest, got.size) != (expected.digest, expected.size):
            raise PartMismatch(
                f"{self.path}: {got.size} bytes received differ from the {expected.size} its writer hashed; "
                "the save is not published"
            )
        return got

    def abort(self) -> None:
        os.close(self._fd)
        self.path.unlink(missing_ok=True)


def check_copy(directory: Path, expected: Mapping[str, str]) -> None:
    """``NodeCopyFailed`` unless ``directory`` holds every file of ``expected`` (name → ``hashing.label``) with
    that digest, and nothing else."""
    try:
        there = list_files(directory)
        for rel, labelled in sorted(expected.items()):
            if rel not in there:
                raise NodeCopyFailed(f"{directory / rel}: missing from the copy sent to this node")
            alg, digest = hashing.split_label(labelled)
            if hashing.digest_file(directory / rel, alg).digest != digest:
                raise NodeCopyFailed(f"{directory / rel}: the copy sent to this node differs from the bundle's file")
        extra = sorted(set(there) - set(expected))
        if extra:
            raise NodeCopyFailed(f"{directory / extra[0]}: not a file of the bundle's policy/")
    except OSError as exc:
        raise NodeCopyFailed(f"the bundle's policy/ sent to {directory} cannot be read back: {exc}") from None
