"""Upload one committed local bundle to the bucket and publish it there.

Order (each step only after the one before succeeded):
  the record still names this attempt (else ``RemoteLeaseLost``) and does not list the step yet (else: done)
  → every file the manifest lists, streamed from the local bundle and hashed *as it is sent*, its digest and size
    compared with the manifest's (a local file changed since the commit: ``RemoteError``, nothing published)
  → ``manifest.json`` last, one small PUT with ``If-None-Match: *`` (never overwritten)
  → every object's size checked on the server (one listing; a file its writer uploaded: its digest too, HEAD)
  → the record's compare-and-swap that lists the bundle (``fence.publish``): the commit point.
A failure anywhere leaves objects under this attempt's own ``bundles/step_N.<run>.e<epoch>/`` that no record
names: never a bundle; the local bundle is only ever read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from sc_app.checkpoint.layout import MANIFEST_FILE
from sc_app.checkpoint.manifest import MAX_MANIFEST_BYTES, Manifest, read_manifest
from sc_app.checkpoint.remote.fence import BUNDLES, RemoteLease, holds, publish
from sc_app.checkpoint.remote.record import Published, bundle_dir
from sc_app.checkpoint.remote.store import PreconditionFailed, RemoteError, Store
from sc_app.io import hashing
from sc_app.io.durable import utc_stamp
from sc_app.io.safe_files import open_regular, read_regular


@dataclass(frozen=True)
class UploadResult:
    step: int
    dir: str  # under <prefix>/bundles/
    bytes: int
    seconds: float
    published: bool  # False: the record already listed this step (nothing uploaded)


class HashingReader:
    """A non-seekable reader of a file descriptor that hashes exactly the bytes it hands out, in order; past
    ``deadline`` (``time.monotonic()``) it refuses to read on, which ends the upload (s3transfer aborts it)."""

    def __init__(self, fd: int, alg: str, deadline: float = float("inf"), what: str = "") -> None:
        self._fd = fd
        self._h = hashing.new(alg)
        self.size = 0
        self._deadline, self._what = deadline, what

    def read(self, n: int = -1) -> bytes:
        if time.monotonic() > self._deadline:
            raise DeadlineExceeded(f"{self._what}: the bundle's upload passed its deadline; retried later")
        chunk = os.read(self._fd, n if n is not None and n >= 0 else hashing.CHUNK)
        self._h.update(chunk)
        self.size += len(chunk)
        return chunk

    def readable(self) -> bool:
        return True

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class DeadlineExceeded(RemoteError):
    """The bundle's upload ran past ``checkpoint.remote.bundle_deadline_s``; it is retried later."""


def upload_bundle(
    store: Store,
    bundle: Path,
    lease: RemoteLease,
    *,
    hmac_key: bytes | None,
    deadline_s: float,
    already: Collection[str] = (),
    gate: Callable[[], AbstractContextManager[object]] = nullcontext,
    name: str | None = None,
) -> UploadResult:
    """Upload ``bundle`` (a committed local ``step_N``, or a sealed ``tmp_step_N``) and publish it (the module
    docstring). ``already``: files its manifest lists that their writers uploaded themselves
    (``checkpoint.remote.parts=direct``): not read here; published only when each object on the server carries the
    manifest's digest (``DIGEST_META``) and size. ``gate``: what the record's compare-and-swap runs under (a sealed
    tmp dir's writer: its lock and local lease, as around a rename). ``name``: the directory under ``bundles/``
    (default: the attempt's own for the step)."""
    t0 = time.monotonic()
    manifest = read_manifest(bundle, hmac_key=hmac_key)
    raw_manifest = read_regular(bundle / MANIFEST_FILE, MAX_MANIFEST_BYTES)
    step = manifest.step
    if holds(store, lease).published(step) is not None:
        return UploadResult(step, "", 0, time.monotonic() - t0, published=False)
    name = name or bundle_dir(step, lease.run_id, lease.epoch)
    total = 0
    todo = sorted((rel, entry) for rel, entry in manifest.files.items() if rel not in already)
    small = [(rel, e) for rel, e in todo if int(str(e["size"])) <= store.cfg.part_size]

    def send(rel: str, entry: dict[str, object]) -> int:
        if time.monotonic() - t0 > deadline_s:
            raise DeadlineExceeded(f"upload of {bundle.name} passed its deadline of {deadline_s:g} s; retried later")
        return _upload_file(store, bundle, rel, store.key(BUNDLES, name, rel), manifest.hash_alg, entry,
                            t0 + deadline_s)  # fmt: skip

    # the small files (one PUT each) max_concurrency at a time; each bigger one in parts, as many in flight
    with ThreadPoolExecutor(max_workers=store.cfg.max_concurrency, thread_name_prefix="s3-put") as pool:
        total += sum(done.result() for done in [pool.submit(send, rel, e) for rel, e in small])
    small_names = {rel for rel, _ in small}
    total += sum(send(rel, e) for rel, e in todo if rel not in small_names)
    key = store.key(BUNDLES, name, MANIFEST_FILE)
    try:
        store.put_small(key, raw_manifest, if_none_match=True)
    except PreconditionFailed:  # an earlier try of this very attempt got this far: the same bytes, or refuse
        there, _ = store.get_small(key, MAX_MANIFEST_BYTES)
        if there != raw_manifest:
            raise RemoteError(f"{store.where(key)}: a different manifest is already there; not publishing") from None
    _check_on_server(store, name, manifest, already)
    entry = Published(step, name, hashing.digest_bytes(raw_manifest, hashing.BLAKE3), lease.run_id, lease.epoch,
                      utc_stamp())  # fmt: skip
    with gate():
        published = publish(store, lease, entry)
    return UploadResult(step, name, total + len(raw_manifest), time.monotonic() - t0, published)


def _check_on_server(store: Store, name: str, manifest: Manifest, already: Collection[str]) -> None:
    """``RemoteError`` unless every file of ``manifest`` is under ``bundles/<name>/`` with its size (one listing),
    and each of ``already`` carries the manifest's digest (its writer's tag, HEAD)."""
    prefix = store.key(BUNDLES, name) + "/"
    listed = {key[len(prefix) :]: size for key, size in store.list(prefix)}
    for rel, entry in manifest.files.items():
        where = store.where(store.key(BUNDLES, name, rel))
        if listed.get(rel) != int(entry["size"]):
            raise RemoteError(f"{where}: {listed.get(rel, 'no')} bytes on the server, the manifest says "
                              f"{entry['size']}; not publishing")  # fmt: skip
        want = hashing.label(manifest.hash_alg, str(entry["digest"]))
        if rel in already and store.head(store.key(BUNDLES, name, rel)).digest != want:
            raise RemoteError(f"{where}: not the bytes its writer uploaded for this bundle (digest); not publishing")


def _upload_file(
    store: Store, bundle: Path, rel: str, key: str, alg: str, entry: dict[str, object], deadline: float
) -> int:
    fd = open_regular(bundle / rel)
    try:
        reader = HashingReader(fd, alg, deadline, f"{bundle.name}/{rel}")
        store.upload_stream(key, reader, size=int(str(entry["size"])))  # type: ignore[arg-type]
    finally:
        os.close(fd)
    if (reader.hexdigest(), reader.size) != (entry["digest"], entry["size"]):
        raise RemoteError(
            f"{bundle / rel}: its bytes no longer match the bundle's manifest ({reader.size} bytes read); "
            "not publishing it (the local bundle is left as it is: `sc-app ckpt verify` says more)"
        )
    return reader.size
