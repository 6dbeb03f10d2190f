"""The controller's half of a save with ``checkpoint.volume: local``: a trainer rank's part staged on its own node's
disk (``PolicyPart.staged_on``) is read back through Ray into the bundle's ``tmp_step_N/policy/``
(``sc_app.checkpoint.node_parts``), so the bundle it commits holds every part, as on a shared volume.

Per file, ``AHEAD`` chunks are in flight while one is written; the ranks are gathered in parallel. A file whose
bytes or size differ from what its writer hashed fails the save (``PartMismatch``); the staged part is dropped
from the rank's disk once the bundle has it, or the save failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from sc_app.checkpoint import node_parts
from sc_app.checkpoint.node_parts import PartFile, PartMismatch, PolicyPart
from sc_app.checkpoint.writer import FileRecord
from sc_app.io import hashing

InBackground = Callable[..., Awaitable[Any]]
AHEAD = 2  # chunk reads in flight per file: the rank reads and Ray carries the next while this one is written


async def gather_policy(
    trainers: Sequence[Any], parts: Sequence[PolicyPart], policy_dir: Path, in_background: InBackground
) -> dict[str, FileRecord]:
    """Every rank's ``PolicyPart`` into ``policy_dir`` (but those the ranks uploaded to the bucket themselves);
    returns the records of the files the writers hashed."""
    records: dict[str, FileRecord] = {}
    for part in parts:
        records.update(part.files)
    staged = [(t, p) for t, p in zip(trainers, parts, strict=True) if p.staged_on is not None and not p.uploaded]
    results = await asyncio.gather(
        *[_gather_rank(t, p, policy_dir, in_background) for t, p in staged], return_exceptions=True
    )
    await asyncio.gather(*[t.drop_part.remote() for t, _ in staged], return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return records


async def _gather_rank(trainer: Any, part: PolicyPart, policy_dir: Path, in_background: InBackground) -> None:
    for rel, size in part.staged.items():
        expected = part.files.get(rel)
        out = await in_background(PartFile, policy_dir, rel, expected.alg if expected else hashing.DEFAULT)
        try:
            offsets = list(range(0, size, node_parts.CHUNK))
            ahead = [trainer.read_part.remote(rel, o) for o in offsets[:AHEAD]]
            for n, offset in enumerate(offsets):
                chunk = await ahead.pop(0)
                if n + AHEAD < len(offsets):
                    ahead.append(trainer.read_part.remote(rel, offsets[n + AHEAD]))
                if len(chunk) != min(node_parts.CHUNK, size - offset):
                    raise PartMismatch(f"{out.path}: {part.staged_on} staged {size} bytes, {offset + len(chunk)} read")
                await in_background(out.write, chunk)
        except BaseException:
            out.abort()
            raise
        got = await in_background(out.close, expected)
        if got.size != size:
            raise PartMismatch(f"{out.path}: {got.size} bytes received, {size} staged on {part.staged_on}")
