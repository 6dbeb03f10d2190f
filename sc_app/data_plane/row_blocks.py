"""One field of one segment as the byte blocks a part file stores, from either shape TransferQueue hands rows in.

* ``packed``: a batched tensor (dense, or nested: what ``TransferQueue``'s get returns after packing every row into
  one freshly allocated tensor) → one block;
* ``rows``: the per-row tensors as a storage unit's reply decoded them (views of the received frames, no copy) →
  one block per row, written back to back. This skips TransferQueue's packing copy: measured here at
  0.7 CPU-ms per MiB (a fresh allocation faulted in + memcpy), more than the write into the page cache itself.

Both give the same ``Blocks`` — and so the same bytes and header in the part file — for the same rows: dense
``[rows, ...]`` when every row has the same shape (scalars: ``[rows]``), else jagged values with offsets.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Blocks:
    views: list[memoryview]  # the field's bytes, in order, without a copy
    dtype: torch.dtype
    shape: list[int]
    offsets: list[int] | None  # jagged row offsets along the first dimension, or None (dense)

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.views)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().cpu().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy())


def packed(value: Any, rows: int, field: str) -> Blocks:
    """A batched tensor of ``rows`` rows (dense or nested)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"field {field!r} holds {type(value).__name__}; the streamed snapshot stores tensors only")
    if value.is_nested and value.layout != torch.jagged:
        value = torch.nested.nested_tensor(list(value.unbind()), layout=torch.jagged)
    if value.is_nested:
        values = value.values().contiguous()
        offsets = [int(o) for o in value.offsets().tolist()]
        lengths = {b - a for a, b in itertools.pairwise(offsets)}
        if len(lengths) == 1:  # equal rows: store dense [rows, len, ...]
            return Blocks([tensor_bytes(values)], values.dtype, [rows, lengths.pop(), *values.shape[1:]], None)
        return Blocks([tensor_bytes(values)], values.dtype, list(values.shape), offsets)
    if value.shape[0] != rows:
        raise ValueError(f"field {field!r} has {value.shape[0]} rows, expected {rows}")
    value = value.contiguous()
    return Blocks([tensor_bytes(value)], value.dtype, list(value.shape), None)


def per_row(values: list[Any], rows: int, field: str) -> Blocks:
    """The per-row tensors of one field (``rows`` of them), each row's bytes a block of its own."""
    if len(values) != rows:
        raise ValueError(f"field {field!r} has {len(values)} rows, expected {rows}")
    if not all(isinstance(v, torch.Tensor) and not v.is_nested for v in values):
        kinds = sorted({type(v).__name__ for v in values})
        raise TypeError(f"field {field!r} holds {', '.join(kinds)}; the streamed snapshot stores tensors only")
    first = values[0]
    rest = tuple(first.shape[1:])
    same_kind = all(v.dtype == first.dtype and v.dim() == first.dim() for v in values)
    if not same_kind or (first.dim() and any(tuple(v.shape[1:]) != rest for v in values)):
        return packed(_pack(values, field), rows, field)  # what TransferQueue would have made of them
    views = [tensor_bytes(v) for v in values]
    if first.dim() == 0:
        return Blocks(views, first.dtype, [rows], None)
    lengths = [int(v.shape[0]) for v in values]
    if len(set(lengths)) == 1:
        return Blocks(views, first.dtype, [rows, lengths[0], *rest], None)
    offsets = [0, *itertools.accumulate(lengths)]
    return Blocks(views, first.dtype, [offsets[-1], *rest], offsets)


def _pack(values: list[torch.Tensor], field: str) -> torch.Tensor:
    """Rows that do not share a shape beyond their first dimension, packed as TransferQueue packs them."""
    for layout in (torch.jagged, torch.strided):
        try:
            return torch.nested.as_nested_tensor(values, layout=layout)
        except (RuntimeError, TypeError):
            continue
    raise TypeError(f"field {field!r}: rows of different dtypes or ranks cannot be stored")
