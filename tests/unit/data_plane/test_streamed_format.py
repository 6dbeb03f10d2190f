"""data_plane.streamed_format: the on-disk format on its own (no Ray, no TransferQueue): bytes round-trip exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from sc_app.data_plane.client import METADATA_FILE
from sc_app.data_plane.streamed_format import (
    STREAMED_FORMAT,
    STREAMED_FORMAT_V1,
    PartWriter,
    StreamedFormatError,
    group_ids,
    is_streamed,
    iter_groups,
    merged_metadata,
    read_metadata,
    stream_parts,
    write_metadata,
)


def _group(seed: int, rows: int = 3) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    jagged = torch.nested.nested_tensor(
        [torch.arange(n, dtype=torch.int32) for n in range(1, rows + 1)], layout=torch.jagged
    )
    return TensorDict(
        {
            "tokens": torch.randint(0, 100, (rows, 5), generator=gen),
            "hidden": torch.randn(rows, 2, 4, generator=gen).to(torch.bfloat16),
            "ragged": jagged,
        },
        batch_size=rows,
    )


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_round_trip_is_bit_exact_across_parts(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path, part_bytes=200)  # tiny parts: several files
    written = {f"g{i}": _group(i) for i in range(4)}
    for gid, data in written.items():
        writer.append(gid, [f"{gid}:{r}" for r in range(3)], [{"group": gid}] * 3, data)
    writer.finish()
    doc = writer.metadata(partition="train", user_metadata={"digest": "d"})
    hashes = dict(writer.hashes)
    hashes[METADATA_FILE] = write_metadata(tmp_path, doc)
    assert len(doc["parts"]) > 1 and doc["rows"] == 12 and doc["groups"] == 4
    assert is_streamed(tmp_path) and read_metadata(tmp_path) == doc, "read back as written (unit may be null)"
    assert set(hashes) == {p.name for p in tmp_path.iterdir()}, "every file written is hashed, nothing else"
    back = {g.group: g for g in iter_groups(tmp_path)}
    assert list(back) == list(written)
    assert [g.group for g in iter_groups(tmp_path, read_metadata(tmp_path), stream=0)] == list(written)
    for gid, data in written.items():
        got = back[gid].data
        assert back[gid].ids == [f"{gid}:{r}" for r in range(3)] and back[gid].tags == [{"group": gid}] * 3
        for key in ("tokens", "hidden"):
            assert got[key].dtype == data[key].dtype and _bits(got[key]) == _bits(data[key])
        assert [t.tolist() for t in got["ragged"].unbind()] == [t.tolist() for t in data["ragged"].unbind()]


def test_no_pickle_only_json_and_raw_bytes(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path, part_bytes=1 << 20)
    writer.append("g0", ["g0:0", "g0:1", "g0:2"], [{}] * 3, _group(0))
    writer.finish()
    write_metadata(tmp_path, writer.metadata(partition="train", user_metadata={}))
    for p in tmp_path.iterdir():
        if p.suffix == ".json":
            json.loads(p.read_text())
        else:
            assert p.suffix == ".bin" and not p.read_bytes().startswith(b"\x80"), "a pickle stream starts with 0x80"


def test_incomplete_or_foreign_directory_is_a_format_error(tmp_path: Path) -> None:
    with pytest.raises(StreamedFormatError, match="missing"):
        read_metadata(tmp_path)
    (tmp_path / METADATA_FILE).write_text(json.dumps({"format": "something-else"}))
    assert not is_streamed(tmp_path)
    with pytest.raises(StreamedFormatError, match="format"):
        read_metadata(tmp_path)


def test_sample_ids_are_grouped_by_their_group_part() -> None:
    assert group_ids(["p1:0", "p0:0", "p1:1", "a:b:0"]) == {"p1": ["p1:0", "p1:1"], "p0": ["p0:0"], "a:b": ["a:b:0"]}
    with pytest.raises(ValueError, match="no group part"):
        group_ids(["lonely"])


def test_streams_of_one_directory_hold_segments_of_the_same_groups(tmp_path: Path) -> None:
    """v2: one writer per storage unit; a group's rows may be split between them, and read back whole."""
    data = _group(7, rows=4)
    ids = [f"g7:{r}" for r in range(4)]
    w0, w1 = PartWriter(tmp_path, 1 << 20, "part-00"), PartWriter(tmp_path, 1 << 20, "part-01")
    w0.append("g7", ids[0::2], [{"r": 0}, {"r": 2}], data[0::2])
    w1.append("g7", ids[1::2], [{"r": 1}, {"r": 3}], data[1::2])
    w1.append("g8", ["g8:0"], [{}], _group(8, rows=1))
    for w in (w0, w1):
        w.finish()
    doc = merged_metadata([w0.summary("u0"), w1.summary("u1")], partition="train", user_metadata={})
    write_metadata(tmp_path, doc)
    assert doc["format"] == STREAMED_FORMAT and doc["rows"] == 5 and doc["groups"] == 2 and doc["segments"] == 3
    assert stream_parts(read_metadata(tmp_path)) == [["part-00-00000"], ["part-01-00000"]]
    segs = list(iter_groups(tmp_path))
    assert [(s.group, s.ids) for s in segs] == [("g7", ids[0::2]), ("g7", ids[1::2]), ("g8", ["g8:0"])]
    assert _bits(segs[1].data["tokens"]) == _bits(data["tokens"][1::2])
    assert [s.group for s in iter_groups(tmp_path, stream=1)] == ["g7", "g8"]


def test_v1_directories_are_still_read(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path, 1 << 20, prefix="part")
    writer.append("g0", ["g0:0", "g0:1", "g0:2"], [{}] * 3, _group(0))
    writer.finish()
    header = tmp_path / "part-00000.json"  # what a v1 writer wrote: its own format in every header
    header.write_text(header.read_text().replace(STREAMED_FORMAT, STREAMED_FORMAT_V1))
    doc = {
        "format": STREAMED_FORMAT_V1,
        "partition": "train",
        "rows": 3,
        "groups": 1,
        "bytes": writer.bytes,
        "parts": writer.parts,
        "user_metadata": {},
    }
    write_metadata(tmp_path, doc)
    assert is_streamed(tmp_path)
    assert stream_parts(read_metadata(tmp_path)) == [["part-00000"]]
    assert [g.ids for g in iter_groups(tmp_path)] == [["g0:0", "g0:1", "g0:2"]]


def test_streams_that_do_not_cover_the_parts_are_refused(tmp_path: Path) -> None:
    writer = PartWriter(tmp_path, 1 << 20)
    writer.append("g0", ["g0:0", "g0:1", "g0:2"], [{}] * 3, _group(0))
    writer.finish()
    doc = writer.metadata(partition="train", user_metadata={})
    doc["streams"][0]["parts"] = []
    write_metadata(tmp_path, doc)
    with pytest.raises(StreamedFormatError, match="streams' parts"):
        read_metadata(tmp_path)
