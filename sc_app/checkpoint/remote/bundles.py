"""The bundles on the bucket: which count, checked how (``check``), and the newest one brought home (``download``).

A remote bundle *counts* when the fencing record lists it and its ``manifest.json`` is there with the digest the
record names, parses (with the HMAC key when one is set), is of this lineage, and every file it lists is on the
server with its size; *verified* adds every file's digest, read back in full. Nothing is ever deleted here.

``download`` streams every file into ``<root>/tmp_step_N.remote-<id>/``, hashing as it writes, refuses the first
byte count or digest that differs from the manifest, writes the manifest last, fsyncs, and only then renames the
directory to ``step_N`` — a local bundle like any other, verified again in full before anything is loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sc_app.checkpoint import layout
from sc_app.checkpoint.manifest import MAX_MANIFEST_BYTES, Manifest, ManifestError, parse_manifest
from sc_app.checkpoint.remote.fence import BUNDLES
from sc_app.checkpoint.remote.record import Published
from sc_app.checkpoint.remote.store import NotFound, RemoteError, Store
from sc_app.io import hashing
from sc_app.io.durable import fsync_tree_dirs, write_durable
from sc_app.io.safe_files import unsafe_rel

log = logging.getLogger(__name__)


class Corrupt(RemoteError):
    """A downloaded file's bytes differ from the manifest's (size or digest): that bundle never resumes."""


@dataclass(frozen=True)
class RemoteBundle:
    entry: Published
    problems: tuple[str, ...]
    manifest: Manifest | None = None
    raw_manifest: bytes = b""
    hash_alg: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def name(self) -> str:
        return layout.step_name(self.entry.step)


def check(
    store: Store, entry: Published, *, lineage: str | None, hmac_key: bytes | None, digests: bool
) -> RemoteBundle:
    """Whether ``entry`` counts (``digests``: and verifies); every problem named, nothing raised but ``RemoteError``
    for a server that cannot be asked."""
    key = store.key(BUNDLES, entry.dir, layout.MANIFEST_FILE)
    try:
        raw, _ = store.get_small(key, MAX_MANIFEST_BYTES)
    except NotFound as exc:  # any other failure of the server is no verdict on the bundle: it propagates
        return RemoteBundle(entry, (f"manifest: {exc}",))
    if hashing.digest_bytes(raw, hashing.BLAKE3) != entry.manifest:
        changed = f"{store.where(key)}: not the manifest the record published (changed on the server)"
        return RemoteBundle(entry, (changed,))
    try:
        manifest = parse_manifest(raw, Path(store.where(key)), hmac_key=hmac_key)
    except ManifestError as exc:
        return RemoteBundle(entry, (str(exc),))
    problems = _file_problems(store, entry, manifest)
    if manifest.step != entry.step:
        problems.append(f"the manifest says step {manifest.step}, the record {entry.step}")
    if lineage is not None and manifest.lineage not in (None, lineage):
        problems.append(f"of lineage {manifest.lineage}, not this directory's {lineage}")
    if digests and not problems:
        problems += _digest_problems(store, entry, manifest)
    return RemoteBundle(entry, tuple(problems), manifest, raw, manifest.hash_alg)


def _file_problems(store: Store, entry: Published, manifest: Manifest) -> list[str]:
    prefix = store.key(BUNDLES, entry.dir) + "/"
    there = {key[len(prefix) :]: size for key, size in store.list(prefix)}
    problems = []
    for rel, want in sorted(manifest.files.items()):
        if (why := unsafe_rel(rel)) is not None:
            problems.append(f"{rel}: {why}")
        elif rel not in there:
            problems.append(f"{rel}: missing on the server")
        elif there[rel] != int(want["size"]):
            problems.append(f"{rel}: {there[rel]} bytes on the server, the manifest says {want['size']}")
    return problems


def _digest_problems(store: Store, entry: Published, manifest: Manifest) -> list[str]:
    problems = []
    for rel, want in sorted(manifest.files.items()):
        body, _ = store.open_read(store.key(BUNDLES, entry.dir, rel))
        h, size = hashing.new(manifest.hash_alg), 0
        try:
            for chunk in body.iter_chunks(hashing.CHUNK):
                h.update(chunk)
                size += len(chunk)
        except Exception as exc:
            raise RemoteError(f"{store.where(store.key(BUNDLES, entry.dir, rel))}: read failed: {exc}") from None
        finally:
            body.close()
        if (h.hexdigest(), size) != (want["digest"], want["size"]):
            problems.append(f"{rel}: its bytes on the server do not match the manifest's digest")
    return problems


def download(store: Store, bundle: RemoteBundle, root: Path, *, concurrency: int) -> Path:
    """Bring ``bundle`` (checked: ``ok``) home as ``root/step_N`` (the module docstring); ``RemoteError`` for a
    byte that differs or a server that fails — the temporary directory is removed, nothing else is touched.
    ``FileExistsError`` when ``step_N`` exists locally (never replaced)."""
    assert bundle.manifest is not None and bundle.ok
    final = root / bundle.name
    if os.path.lexists(final):
        raise FileExistsError(f"{final} exists; the bucket's copy is not brought over it")
    tmp = root / f"{layout.tmp_name(bundle.entry.step)}.remote-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        files = sorted(bundle.manifest.files.items())
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="s3-get") as pool:
            for done in [pool.submit(_fetch_file, store, bundle, rel, want, tmp) for rel, want in files]:
                done.result()
        write_durable(tmp / layout.MANIFEST_FILE, bundle.raw_manifest)
        fsync_tree_dirs(tmp)
        os.rename(tmp, final)  # same directory: atomic; step_N appears complete or not at all
        return final
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise


def fetch_files(store: Store, bundle: RemoteBundle, rels: list[str], dest: Path, *, concurrency: int) -> None:
    """Stream the files ``rels`` of ``bundle`` (checked: ``ok``) into ``dest/<rel>``, each hashed as it is written
    (``Corrupt`` at the first size or digest that differs from the manifest); what a reader needs of a bundle
    (``sc-app export --remote``: the policy) without bringing all of it home. The caller removes ``dest``."""
    assert bundle.manifest is not None and bundle.ok
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="s3-get") as pool:
        for done in [pool.submit(_fetch_file, store, bundle, rel, bundle.manifest.files[rel], dest) for rel in rels]:
            done.result()


def _fetch_file(store: Store, bundle: RemoteBundle, rel: str, want: dict[str, object], tmp: Path) -> None:
    key = store.key(BUNDLES, bundle.entry.dir, rel)
    dest = tmp / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    body, length = store.open_read(key)
    h, size = hashing.new(bundle.hash_alg), 0
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            for chunk in body.iter_chunks(hashing.CHUNK):
                size += len(chunk)
                if size > int(str(want["size"])):
                    raise Corrupt(f"{store.where(key)}: longer than the manifest's {want['size']} bytes")
                h.update(chunk)
                view = memoryview(chunk)
                while view:  # a full disk raises OSError
                    view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except (OSError, RemoteError):
        raise
    except Exception as exc:  # botocore's read errors (connection reset, timeout)
        raise RemoteError(f"{store.where(key)}: read failed: {exc}") from None
    finally:
        body.close()
    if (h.hexdigest(), size) != (want["digest"], want["size"]):
        raise Corrupt(f"{store.where(key)}: its bytes do not match the manifest's digest: that bundle is not used")
    del length
