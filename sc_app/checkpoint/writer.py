"""BundleWriter: builds ``tmp_step_N/`` and publishes it as ``step_N/`` by one rename.

Invariants: ``step_N/`` appears only by renaming a ``tmp_step_N/`` whose files are all fsynced and listed
in its manifest (written last); an existing ``step_N/`` is never overwritten; a leftover ``tmp_step_N/`` from an
earlier attempt is moved to quarantine, never deleted; ``abort()`` removes only the tmp dir this writer created.
With a ``Lease``, creating the tmp dir and the publishing rename happen only while this run holds it (fencing).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_app.checkpoint import layout
from sc_app.checkpoint.hmac_keys import HmacKey
from sc_app.checkpoint.lease import LeaseLost
from sc_app.checkpoint.manifest import render
from sc_app.checkpoint.quarantine import move_aside
from sc_app.faults import fault_point
from sc_app.io import hashing
from sc_app.io.durable import fsync_dir, fsync_tree_dirs, hash_and_fsync, write_durable

if TYPE_CHECKING:
    from sc_app.checkpoint.lease import Lease

log = logging.getLogger(__name__)


# A file of the bundle a writer wrote and hashed as it wrote it (a trainer's policy files): the commit takes these
# (``prehashed``) instead of reading the file back.
FileRecord = hashing.FileDigest


class BundleExistsError(FileExistsError):
    pass


class SaveAbandoned(RuntimeError):
    """The save was abandoned (a stop could not wait for it): never renamed, its tmp dir left for quarantine."""


class BundleWriter:
    def __init__(
        self,
        root: str | Path,
        step: int,
        *,
        hmac_key: HmacKey | None = None,
        lease: Lease | None = None,
        hash_alg: str = hashing.DEFAULT,
    ) -> None:
        self.root = Path(root)
        self.step = step
        self.lease = lease
        owner, epoch = (lease.run_id, lease.fencing_epoch) if lease is not None else (None, None)
        self.tmp = self.root / layout.tmp_name(step, owner, epoch)  # keyed by run and epoch: never a successor's
        self.final = self.root / layout.step_name(step)
        self._hmac_key = hmac_key
        self.hash_alg = hashing.check_alg(hash_alg)  # of every file digest the manifest lists
        self._created = False
        self._abandoned = self._renamed = False
        self._commit = threading.Lock()  # abandon() vs. the rename: one of them, never both

    # paths inside the bundle being written
    @property
    def policy_dir(self) -> Path:
        return self.tmp / layout.POLICY_DIR

    @property
    def loader_path(self) -> Path:
        return self.tmp / layout.LOADER_FILE

    @property
    def data_plane_dir(self) -> Path:
        return self.tmp / layout.DATA_PLANE_DIR

    @property
    def sidecar_path(self) -> Path:
        return self.tmp / layout.SIDECAR_FILE

    def held(self) -> Any:
        """The directory lock and the lease check (nothing without a lease): what every change to the directory
        by this writer runs under."""
        return self.lease.held() if self.lease is not None else nullcontext()

    def begin(self) -> BundleWriter:
        """Make ``tmp_step_N`` (under the lease); a no-op when this writer already made it."""
        if self._created:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        with self.held():
            self._begin_locked()
        return self

    def _begin_locked(self) -> None:
        if os.path.lexists(self.final):  # a link named step_N too: never replaced, never followed
            raise BundleExistsError(f"{self.final} already exists; refusing to overwrite a bundle")
        if os.path.lexists(self.tmp):
            moved = move_aside(self.tmp, self.root / layout.QUARANTINE_DIR, "abandoned tmp dir found by a new save")
            log.warning("moved abandoned %s to %s", self.tmp.name, moved)
        self.tmp.mkdir()
        self._created = True
        self.policy_dir.mkdir()
        fsync_dir(self.root)

    def commit(self, record: dict[str, Any], prehashed: dict[str, dict[str, Any]] | None = None) -> Path:
        """``seal``, then rename. Returns ``step_N/``."""
        self.seal(record, prehashed)
        with self._commit, self.held():
            if self._abandoned:
                raise SaveAbandoned(f"{self.tmp.name} was abandoned; not renamed")
            if os.path.lexists(self.final):
                raise BundleExistsError(f"{self.final} appeared while saving; refusing to overwrite it")
            fault_point("save.rename")
            os.rename(self.tmp, self.final)
            fsync_dir(self.root)
            self._renamed = True
        self._created = False
        return self.final

    def seal(
        self,
        record: dict[str, Any],
        prehashed: dict[str, dict[str, Any]] | None = None,
        elsewhere: Mapping[str, FileRecord] | None = None,
    ) -> None:
        """Hash + fsync every file, write the manifest (``record`` + step + files) last, fsync dirs.

        ``prehashed``: bundle-relative path → ``hashing.FileDigest.as_dict()`` of files whose writer already
        fsynced them and hashed exactly the bytes it wrote (policy files, the streamed data plane); they are not read
        again. Their size on disk must still match, else the seal fails; one hashed by another algorithm than
        this bundle's is read again. ``elsewhere``: files the manifest lists that are not in the tmp dir (uploaded
        to the bucket by their writers: ``sc_app.checkpoint.remote.parts``), hashed by this bundle's algorithm."""
        prehashed = prehashed or {}
        away = dict(elsewhere or {})
        files: dict[str, dict[str, Any]] = {}
        for dirpath, _, names in os.walk(self.tmp):
            for name in names:
                p = Path(dirpath) / name
                rel = p.relative_to(self.tmp).as_posix()
                if rel == layout.MANIFEST_FILE:
                    continue
                if rel in away:
                    raise OSError(f"{p}: uploaded by its writer, yet also in the bundle's tmp dir")
                known = prehashed.get(rel)
                if known is not None and known["alg"] == self.hash_alg:
                    size = p.stat().st_size
                    if size != known["size"]:
                        raise OSError(f"{p}: {size} bytes on disk, its writer wrote {known['size']}")
                    files[rel] = {"digest": known["digest"], "size": size}
                    continue
                got = hash_and_fsync(p, self.hash_alg)
                files[rel] = {"digest": got.digest, "size": got.size}
        for rel, got in away.items():
            if got.alg != self.hash_alg:
                raise OSError(f"{self.tmp / rel}: hashed with {got.alg} by its writer, not {self.hash_alg}")
            files[rel] = {"digest": got.digest, "size": got.size}
        missing = [e for e in layout.REQUIRED_ENTRIES if not (self.tmp / e).exists()]
        if missing:
            raise FileNotFoundError(f"{self.tmp}: bundle incomplete, missing {', '.join(missing)}")
        unseen = sorted(set(prehashed) - set(files))
        if unseen:  # a writer wrote it, but not here: checkpoint.dir is not one directory for every writer
            raise FileNotFoundError(
                f"{self.tmp}: bundle incomplete, {len(unseen)} file(s) its writers wrote are not in it (first: "
                f"{unseen[0]}); every bundle writer (trainer ranks, storage units) must see this directory: a "
                'volume shared by their nodes (docs/object-storage.md "Without a shared volume")'
            )
        doc = {**record, "step": self.step, "hash_alg": self.hash_alg, "files": dict(sorted(files.items()))}
        fault_point("save.manifest")
        write_durable(self.tmp / layout.MANIFEST_FILE, render(doc, self._hmac_key))
        fault_point("save.fsync")
        fsync_tree_dirs(self.tmp)

    @contextmanager
    def publishing(self) -> Iterator[None]:
        """The commit point of a sealed bundle published somewhere else than by a rename (the bucket: its record's
        compare-and-swap runs inside): under the same lock and lease check as the rename, never after ``abandon``."""
        with self._commit, self.held():
            if self._abandoned:
                raise SaveAbandoned(f"{self.tmp.name} was abandoned; not published")
            fault_point("save.publish")
            yield
            self._renamed = True

    def abandon(self, wait_s: float = 1.0) -> bool:
        """From now on this bundle is never renamed, and ``abort`` leaves its tmp dir (the next lease holder's tidy
        quarantines it). False when it was renamed already, or its rename is under way (it publishes)."""
        if not self._commit.acquire(timeout=wait_s):
            return False
        try:
            if self._renamed:
                return False
            self._abandoned = True
            return True
        finally:
            self._commit.release()

    def abort(self) -> None:
        """Remove the tmp dir this writer created (and nothing else) — only while this run still holds the lease:
        a fenced-off writer removes nothing (its tmp dir may already be the new holder's to tidy)."""
        if not self._created or self._abandoned:
            return
        self._created = False
        try:
            with self.held():
                if self.tmp.exists():
                    shutil.rmtree(self.tmp, ignore_errors=True)
        except LeaseLost:
            log.warning("leaving %s: this run no longer holds the lease (the holder tidies it)", self.tmp)
