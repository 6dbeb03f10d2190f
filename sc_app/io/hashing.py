"""The one way sc-app digests a bundle's files: a named algorithm, chosen by the manifest. Pure: no Ray, no torch.

``BLAKE3`` is what new bundles are written with (cryptographic, ~3x sha256's speed on one core here, and its
``update`` releases the GIL, so a writer thread hashes while another thread runs Python); ``SHA256`` is what every
bundle written before the manifest named its algorithm used, and is still read (and can still be written).
A file digest is recorded as ``FileDigest`` (``{"alg", "digest", "size"}`` as plain data between processes).

Invariant: a digest is only ever compared with one taken by the *same* algorithm — ``FileDigest.matches`` and
the manifest's ``hash_alg`` make the algorithm part of what is compared, never a guess from the digest's length.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import blake3

SHA256 = "sha256"
BLAKE3 = "blake3"
ALGORITHMS = (SHA256, BLAKE3)
DEFAULT = BLAKE3  # what new bundles are written with
LEGACY = SHA256  # what a manifest that names no algorithm (schema_version 1) used
CHUNK = 8 * 1024 * 1024
HEX_LEN = 64  # both algorithms give 32-byte digests


class Hasher(Protocol):
    def update(self, data: Any, /) -> Any: ...

    def hexdigest(self) -> str: ...


class UnknownAlgorithm(ValueError):
    pass


def check_alg(alg: str) -> str:
    if alg not in ALGORITHMS:
        raise UnknownAlgorithm(f"unknown file hash algorithm {alg!r} (sc-app knows {', '.join(ALGORITHMS)})")
    return alg


def new(alg: str = DEFAULT) -> Hasher:
    """A fresh incremental hasher of ``alg``: ``update(bytes-like)`` then ``hexdigest()``."""
    if check_alg(alg) == BLAKE3:
        return blake3.blake3()
    return hashlib.sha256()


def digest_bytes(data: Any, alg: str = DEFAULT) -> str:
    h = new(alg)
    h.update(data)
    return h.hexdigest()


@dataclass(frozen=True)
class FileDigest:
    """The digest and size of exactly the bytes of one file, with the algorithm that took it."""

    alg: str
    digest: str
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {"alg": self.alg, "digest": self.digest, "size": self.size}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FileDigest:
        return cls(check_alg(str(d["alg"])), str(d["digest"]), int(d["size"]))

    def matches(self, alg: str, digest: str, size: int) -> bool:
        return (self.alg, self.digest, self.size) == (alg, digest, size)


def digest_fd(fd: int, alg: str = DEFAULT, *, fsync: bool = False) -> tuple[str, int]:
    """Digest and size of what ``fd`` reads from its position to the end (one pass; ``fsync``: fsync it too).
    Reads into one reused buffer: no allocation per chunk."""
    h = new(alg)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = 0
    while n := os.readv(fd, [buf]):
        h.update(view[:n])
        size += n
    if fsync:
        os.fsync(fd)
    return h.hexdigest(), size


def digest_file(path: str | Path, alg: str = DEFAULT, *, fsync: bool = False) -> FileDigest:
    fd = os.open(path, os.O_RDONLY)
    try:
        digest, size = digest_fd(fd, alg, fsync=fsync)
    finally:
        os.close(fd)
    return FileDigest(alg, digest, size)


class HashingWriter:
    """Writes to a raw (unbuffered) file and hashes each chunk in the same pass, while it is hot in the cache.

    ``write`` takes any contiguous bytes-like object (a tensor's memoryview too) without copying it; big buffers
    go down in ``CHUNK``-sized slices, each written then hashed, so the hash reads from cache, not memory."""

    def __init__(self, raw: Any, alg: str = DEFAULT) -> None:
        self._raw = raw
        self.alg = alg
        self._h = new(alg)
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = view.nbytes
        for start in range(0, total, CHUNK):
            chunk = view[start : start + CHUNK]
            while chunk.nbytes:
                n = self._raw.write(chunk)
                self._h.update(chunk[:n])
                chunk = chunk[n:]
        self.size += total
        return total

    def flush(self) -> None:
        pass  # nothing buffered: every write went to the raw file

    def result(self) -> FileDigest:
        return FileDigest(self.alg, self._h.hexdigest(), self.size)


def label(alg: str, digest: str) -> str:
    """``"<alg>:<hex>"``: a digest that carries its algorithm (what a reader of a bundle's files is handed)."""
    return f"{check_alg(alg)}:{digest}"


def split_label(labelled: str) -> tuple[str, str]:
    """``(alg, hex)`` of ``label``'s output; a bare hex digest is a sha256 (what readers were handed before
    digests carried their algorithm)."""
    alg, sep, digest = labelled.partition(":")
    return (check_alg(alg), digest) if sep else (LEGACY, labelled)


def bytes_match(data: Any, labelled: str | None) -> bool:
    """Whether ``data`` has the digest ``labelled`` (``label``'s form), by that digest's own algorithm."""
    if not labelled:
        return False
    alg, digest = split_label(labelled)
    return digest_bytes(data, alg) == digest
