"""Verified reads of a DCP policy directory (``policy_ckpt``): every byte is checked against the digest the caller
took from the verified manifest before anything is deserialised.

``VerifiedReader`` (a DCP ``FileSystemReader``) reads each file's bytes once and checks them; ``.metadata`` (a pickle)
is decoded by ``decode_metadata`` through an unpickler that admits only DCP's metadata classes (the restore and
verification, ``policy_check``, both call it); ``SafeLoadPlanner`` loads non-tensor items ``weights_only``. A file
not listed, or with other bytes, is ``PolicyIntegrityError``.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from sc_app.io import hashing

DCP_METADATA_FILE = ".metadata"  # DCP's global metadata file in policy/ (the data plane's is metadata.json)


class PolicyIntegrityError(RuntimeError):
    """A policy file is not listed in the manifest, differs from it, or holds something DCP never writes."""


_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only what DCP's ``.metadata`` holds (its dataclasses, torch sizes, dtypes and layouts, paths)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise PolicyIntegrityError(f"{DCP_METADATA_FILE} refers to {module}.{name}, which DCP metadata never holds")


def decode_metadata(data: bytes) -> Metadata:
    """``.metadata``'s bytes (already checked against the manifest) → DCP ``Metadata``, through the allowlist
    unpickler; the restore and verification (``policy_check``) both decode it here. ``PolicyIntegrityError``
    for anything else."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except PolicyIntegrityError:
        raise
    except Exception as exc:  # truncated or garbled pickle bytes: whatever pickle raises is "not DCP metadata"
        raise PolicyIntegrityError(f"{DCP_METADATA_FILE} is not DCP metadata ({type(exc).__name__})") from None
    if not isinstance(metadata, Metadata):
        raise PolicyIntegrityError(f"{DCP_METADATA_FILE} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class _VerifiedFileSystem(FileSystem):
    """Read-only: a stream is the verified bytes of one listed file, read once."""

    def __init__(self, root: Path, expected: Mapping[str, str]) -> None:
        super().__init__()
        self.root = root
        self.expected = dict(expected)

    def verified_bytes(self, name: str) -> bytes:
        if name not in self.expected:
            raise PolicyIntegrityError(f"{self.root / name}: not listed in the bundle manifest; refusing to read it")
        data = (self.root / name).read_bytes()
        if not hashing.bytes_match(data, self.expected[name]):
            alg, _ = hashing.split_label(self.expected[name])
            raise PolicyIntegrityError(f"{self.root / name}: {alg} does not match the manifest (changed since verify)")
        return data

    @contextmanager
    def create_stream(self, path: str | Any, mode: str) -> Iterator[io.IOBase]:
        if mode not in ("rb", "r"):
            raise PolicyIntegrityError(f"{path}: verified reader opened for writing")
        p = Path(path)
        if p.parent != self.root:
            raise PolicyIntegrityError(f"{p}: outside the policy directory {self.root}")
        yield io.BytesIO(self.verified_bytes(p.name))


class VerifiedReader(FileSystemReader):
    """DCP ``FileSystemReader`` whose every byte is checked against ``expected`` (name → labelled digest,
    ``hashing.label``; a bare hex digest is a sha256) first.

    ``read_metadata`` verifies and decodes ``.metadata`` once and keeps it, so a caller can call it before
    ``dcp.load`` and get a refusal as itself rather than folded into DCP's error text."""

    def __init__(self, path: str | Path, expected: Mapping[str, str]) -> None:
        super().__init__(path)
        self.fs = _VerifiedFileSystem(Path(self.path), expected)
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise PolicyIntegrityError("per-rank DCP metadata is not part of a bundle")
        if self._metadata is None:
            fs: _VerifiedFileSystem = self.fs  # type: ignore[assignment]
            metadata = decode_metadata(fs.verified_bytes(DCP_METADATA_FILE))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            self._metadata = metadata
        assert self._metadata.storage_meta is not None
        self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that non-tensor items load with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else "refused"
            raise PolicyIntegrityError(
                f"policy item {read_item.dest_index.fqn}: not plain data, refused by weights_only ({first})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
