"""data_plane.part_buffers: a restore's segment buffers are reused only once nothing views them (no Ray, no
TransferQueue): pooled reads give the same bytes as fresh ones, a held buffer is never lent again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from sc_app.data_plane.part_buffers import PartBuffers
from sc_app.data_plane.streamed_format import PartWriter, iter_groups, write_metadata


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _snapshot(tmp_path: Path, groups: int = 6) -> None:
    writer = PartWriter(tmp_path, part_bytes=300)  # a part per group or two
    for i in range(groups):
        gen = torch.Generator().manual_seed(i)
        ragged = torch.nested.nested_tensor([torch.arange(1 + i % 2), torch.arange(2)], layout=torch.jagged)
        td = TensorDict(
            {"x": torch.randn(2, 16, generator=gen), "t": torch.randint(0, 9, (2, 3)), "r": ragged}, batch_size=2
        )
        writer.append(f"g{i}", [f"g{i}:0", f"g{i}:1"], [{"group": f"g{i}"}] * 2, td)
    writer.finish()
    write_metadata(tmp_path, writer.metadata(partition="p", user_metadata={}))


def test_pooled_reads_equal_fresh_reads_and_buffers_are_reused(tmp_path: Path) -> None:
    _snapshot(tmp_path)

    def seen(g: Any) -> tuple[Any, ...]:
        return g.group, _bits(g.data["x"]), _bits(g.data["t"]), [r.tolist() for r in g.data["r"].unbind()]

    fresh = [seen(g) for g in iter_groups(tmp_path)]
    pool = PartBuffers()
    pooled = []
    for g in iter_groups(tmp_path, buffers=pool):
        pooled.append(seen(g))  # read before it is given back
        g.release()
        g.release()  # a second release of the same group is a no-op
    assert pooled == fresh
    parts = len(list(tmp_path.glob("*.bin")))
    assert parts > 2 and pool.allocated <= 2, f"6 segments of {parts} parts read through {pool.allocated} buffers"


def test_a_held_buffer_is_not_lent_again(tmp_path: Path) -> None:
    _snapshot(tmp_path)
    fresh = [_bits(g.data["x"]) for g in iter_groups(tmp_path)]
    pool = PartBuffers()
    held = list(iter_groups(tmp_path, buffers=pool))  # nothing released: every segment keeps its own buffer
    assert [_bits(g.data["x"]) for g in held] == fresh, "no segment overwrote another's bytes"
    assert pool.allocated == len(held) == 6
    for g in held:
        g.release()
    lease = pool.take(10)
    lease.release()
    with pytest.raises(RuntimeError, match="already given back"):
        lease.hold()


def test_pool_keeps_at_most_keep_free_buffers() -> None:
    pool = PartBuffers(keep=2)
    leases = [pool.take(n) for n in (10, 20, 30)]
    for lease in leases:
        lease.release()
    again = pool.take(15)
    assert again.tensor.numel() == 15 and pool.allocated == 3, "a free buffer large enough is lent, sliced to size"
    assert pool.take(40) is not None and pool.allocated == 4, "none large enough: a new one"


def test_the_smallest_fitting_buffer_is_lent_whatever_its_place() -> None:
    pool = PartBuffers()
    leases = [pool.take(n) for n in (30, 10, 20)]  # sizes differ: tensors that cannot be compared element-wise
    bases = [lease.tensor.data_ptr() for lease in leases]
    for lease in leases:
        lease.release()
    assert pool.take(15).tensor.data_ptr() == bases[2], "20 fits 15 best, third in the free list"
    assert pool.take(5).tensor.data_ptr() == bases[1]
    assert pool.take(25).tensor.data_ptr() == bases[0] and pool.allocated == 3
