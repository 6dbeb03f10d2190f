"""How a DCP policy save reaches its files (``policy_ckpt.write``): every byte hashed on its way out, the many small
writes of each item gathered, the tensors' bytes written from their own memory. Same bytes as DCP's own writer.

DCP saves every tensor with ``torch.save`` into the rank's shard file: ~37 writes per item, all but one of them zip
record headers of 1-160 bytes. Passed one by one through DCP's stream wrapper, a hashing stream and a buffered file,
those cost more Python calls and hash updates than the item's data (a 360 MiB medium model: 11,600 writes for 314
items). Here small writes collect in one buffer (hashed and written together when a large write or the end of the
file comes), large ones go straight to the unbuffered file and the hash, and DCP's per-item wrapper is a thin one
that neither flushes nor adds a Python frame per write.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem, _StorageWriterTransforms

from sc_app.checkpoint.writer import FileRecord
from sc_app.io import hashing

SMALL = 64 * 1024  # writes below this are gathered; a gathered buffer is written out once it reaches it


class GatheringHashWriter(io.RawIOBase):
    """Append-only writer of one policy file: hashes every byte (``hashing.HashingWriter``), gathers small writes.

    ``tell()`` counts gathered bytes too (DCP records item offsets with it); ``flush``/``fileno`` write them out
    first (DCP fsyncs ``fileno()`` without a flush)."""

    def __init__(self, raw: Any, alg: str) -> None:
        super().__init__()
        self._raw = raw
        self._out = hashing.HashingWriter(raw, alg)
        self._pending = bytearray()
        self.alg = alg

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b)
        n = view.nbytes
        if n < SMALL:
            self._pending += view  # a copy: torch's writer lends its buffers only for the call
            if len(self._pending) >= SMALL:
                self._drain()
            return n
        self._drain()
        self._out.write(view)
        return n

    def _drain(self) -> None:
        if self._pending:
            self._out.write(self._pending)
            self._pending = bytearray()

    @property
    def size(self) -> int:
        return self._out.size + len(self._pending)

    def hexdigest(self) -> str:
        self._drain()
        return self._out.result().digest

    def tell(self) -> int:
        return self.size

    def seek(self, *args: Any) -> int:
        raise io.UnsupportedOperation("a hashed policy file is written front to back")

    def flush(self) -> None:
        self._drain()

    def fileno(self) -> int:
        self._drain()
        return int(self._raw.fileno())


class _ItemStream:
    """What DCP hands ``torch.save`` for one item: the file's ``write`` itself; ``close`` keeps the file open and
    gathering (DCP's own wrapper flushes the file after every item)."""

    def __init__(self, raw: Any) -> None:
        self.write = raw.write

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class ItemTransforms(_StorageWriterTransforms):
    """DCP's stream transforms with no extensions (what sc-app saves with), without the per-write wrapper."""

    def __init__(self) -> None:
        super().__init__(())

    def transform_save_stream(self, write_item: Any, raw_stream: Any) -> tuple[Any, list[str]]:
        return _ItemStream(raw_stream), []


class HashingFileSystem(FileSystem):
    """DCP's local file system, recording the digest (``hash_alg``) and size of every file this process writes (and
    following DCP's rename of ``.metadata.tmp``), so nothing is read back to be hashed."""

    def __init__(self, hash_alg: str = hashing.DEFAULT) -> None:
        super().__init__()
        self.hash_alg = hash_alg
        self.records: dict[str, FileRecord] = {}

    @contextmanager
    def create_stream(self, path: str | Any, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        p = Path(path)
        with p.open("wb", buffering=0) as raw:
            stream = GatheringHashWriter(raw, self.hash_alg)
            yield stream
            digest = stream.hexdigest()
        self.records[p.name] = FileRecord(stream.alg, digest, stream.size)

    def rename(self, path: str | Any, new_path: str | Any) -> None:
        super().rename(path, new_path)
        record = self.records.pop(Path(path).name, None)
        if record is not None:
            self.records[Path(new_path).name] = record
