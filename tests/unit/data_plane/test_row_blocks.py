"""row_blocks: rows written from the storage units' per-row tensors (no packing copy) give the very bytes, headers
and digests that the same rows packed the way TransferQueue packs them give — for every shape a field can have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from transfer_queue.storage.managers.simple_storage_manager import AsyncSimpleStorageManager as SimpleStorageManager

from sc_app.data_plane import row_blocks
from sc_app.data_plane.streamed_format import PartWriter, iter_groups, write_metadata

ROWS = 3


def _rows(kind: str) -> list[torch.Tensor]:
    if kind == "scalars":
        return [torch.tensor(float(i)) for i in range(ROWS)]
    if kind == "vectors":
        return [torch.arange(5, dtype=torch.int64) + i for i in range(ROWS)]
    if kind == "matrices":
        return [torch.full((4, 2), i, dtype=torch.float32) for i in range(ROWS)]
    if kind == "jagged":
        return [torch.arange(i + 1, dtype=torch.int32) for i in range(ROWS)]
    if kind == "jagged2d":
        return [torch.ones(i + 2, 3, dtype=torch.bfloat16) * i for i in range(ROWS)]
    if kind == "bools":
        return [torch.tensor([True, False, i % 2 == 0]) for i in range(ROWS)]
    if kind == "views":  # rows that are views into one received buffer, as a unit's reply decodes them
        buf = torch.arange(ROWS * 6, dtype=torch.float32)
        return [buf[i * 6 : (i + 1) * 6] for i in range(ROWS)]
    raise AssertionError(kind)


KINDS = ["scalars", "vectors", "matrices", "jagged", "jagged2d", "bools", "views"]


def _joined(b: row_blocks.Blocks) -> bytes:
    return b"".join(bytes(v) for v in b.views)


@pytest.mark.parametrize("kind", KINDS)
def test_per_row_blocks_equal_transferqueues_packed_rows(kind: str) -> None:
    rows = _rows(kind)
    packed = row_blocks.packed(SimpleStorageManager._pack_field_values(rows), ROWS, "f")
    mine = row_blocks.per_row(rows, ROWS, "f")
    assert (mine.dtype, mine.shape, mine.offsets) == (packed.dtype, packed.shape, packed.offsets)
    assert _joined(mine) == _joined(packed) and mine.nbytes == packed.nbytes
    assert len(mine.views) == ROWS, "one block per row: nothing was copied into a new buffer"


def _write(tmp: Path, name: str, append: Any) -> tuple[bytes, dict[str, Any]]:
    d = tmp / name
    d.mkdir()
    w = PartWriter(d, part_bytes=1 << 20)
    append(w)
    w.finish()
    write_metadata(d, w.metadata(partition="train", user_metadata={}))
    return (d / "part-00-00000.bin").read_bytes() + (d / "part-00-00000.json").read_bytes(), w.hashes


def test_a_part_written_from_rows_is_the_part_written_from_packed_rows(tmp_path: Path) -> None:
    columns = {kind: _rows(kind) for kind in KINDS}
    ids = [f"g:{i}" for i in range(ROWS)]
    tags = [{"group": "g"}] * ROWS
    td = TensorDict({k: SimpleStorageManager._pack_field_values(v) for k, v in columns.items()}, batch_size=ROWS)
    a = _write(tmp_path, "packed", lambda w: w.append_all([("g", ids, tags, td)]))
    b = _write(tmp_path, "rows", lambda w: w.append_all([("g", ids, tags, columns)]))
    assert a == b
    (group,) = list(iter_groups(tmp_path / "rows"))
    for kind in ("scalars", "vectors", "matrices", "bools"):
        assert torch.equal(group.data[kind], torch.stack(columns[kind])), kind
    jagged = group.data["jagged"]
    assert [r.tolist() for r in jagged.unbind()] == [r.tolist() for r in columns["jagged"]]


def test_rows_of_other_ranks_are_packed_as_transferqueue_would() -> None:
    rows = [torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 5)]  # differ beyond the first dimension
    blocks = row_blocks.per_row(rows, 3, "f")
    assert blocks.nbytes == sum(r.numel() * 4 for r in rows)


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([torch.zeros(1), "text", torch.zeros(1)], TypeError),
        ([torch.zeros(1)] * 2, ValueError),  # two rows where three were captured
    ],
)
def test_what_cannot_be_stored_is_refused_by_name(rows: list[Any], error: type[Exception]) -> None:
    with pytest.raises(error, match="'f'"):
        row_blocks.per_row(rows, 3, "f")
