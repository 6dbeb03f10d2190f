"""rl.hf.policy_stream: the gathered, hashed writes of a DCP policy save put exactly the bytes written on disk, in
order, at the offsets ``tell()`` promised, and the recorded digest is that of the file."""

from __future__ import annotations

import io
import itertools
import os
from pathlib import Path

import pytest
import torch

from sc_app.io import hashing
from sc_app.rl.hf.policy_stream import SMALL, GatheringHashWriter, HashingFileSystem


def test_small_and_large_writes_land_in_order_with_their_offsets(tmp_path: Path) -> None:
    chunks = [
        b"a" * 30,
        b"b" * 7,
        os.urandom(SMALL + 5),
        b"c" * 160,
        os.urandom(SMALL - 1),
        b"d",
        os.urandom(3 * SMALL),
    ]
    path = tmp_path / "f"
    offsets = []
    with path.open("wb", buffering=0) as raw:
        w = GatheringHashWriter(raw, hashing.BLAKE3)
        for c in chunks:
            offsets.append(w.tell())
            assert w.write(memoryview(c)) == len(c)
        digest = w.hexdigest()
        size = w.size
    data = path.read_bytes()
    assert data == b"".join(chunks) and size == len(data)
    assert offsets == [sum(len(c) for c in chunks[:i]) for i in range(len(chunks))]
    assert digest == hashing.digest_bytes(data, hashing.BLAKE3)


def test_fileno_writes_gathered_bytes_first(tmp_path: Path) -> None:
    path = tmp_path / "f"
    with path.open("wb", buffering=0) as raw:
        w = GatheringHashWriter(raw, hashing.BLAKE3)
        w.write(b"header")
        os.fsync(w.fileno())  # DCP fsyncs the metadata file so, with no flush before
        assert path.read_bytes() == b"header"
    with pytest.raises(io.UnsupportedOperation):
        w.seek(0)


def test_file_system_records_what_torch_save_wrote(tmp_path: Path) -> None:
    fs = HashingFileSystem()
    tensors = {"w": torch.randn(64, 33), "step": torch.tensor(3.0)}
    offsets = []
    with fs.create_stream(tmp_path / "x.tmp", "wb") as stream:
        for t in tensors.values():
            offsets.append(stream.tell())
            torch.save(t, stream)
        offsets.append(stream.tell())
    fs.rename(tmp_path / "x.tmp", tmp_path / "x")
    data = (tmp_path / "x").read_bytes()
    record = fs.records["x"]
    assert "x.tmp" not in fs.records and record.size == len(data)
    assert record.digest == hashing.digest_bytes(data, record.alg)
    for (start, end), want in zip(itertools.pairwise(offsets), tensors.values(), strict=True):
        got = torch.load(io.BytesIO(data[start:end]), weights_only=True)  # each item's slice reads as itself (DCP)
        assert torch.equal(got, want)
