"""The data-plane sections' CPU-cost half (issue 21): CPU-seconds of a save against TransferQueue's own get plus a
raw write of the same bytes, and of a restore against a raw read plus TransferQueue's own put, interleaved per
repetition (``cpu.interleave``) on one size's live rows (``snapshot.OneSize``). Saves here run without the rollout
stream, so only the save's own work is counted."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from pathlib import Path
from typing import Any

from bench.scbench import cpu
from bench.scbench.common import drop_cache, files_under, raw_read, raw_write


async def saves(one: Any, meter: cpu.CpuMeter) -> dict[str, list[cpu.Sample]]:
    """The streamed save, TransferQueue's own get and a raw write + fsync, ``one.reps`` times each."""

    async def save_quiet() -> None:
        await one.save(one.streamed_now("streamed"), one.base / f"cpu_save{uuid.uuid4().hex[:6]}", rollouts=False)

    out = await cpu.interleave(
        meter,
        one.reps,
        {
            "save": (None, save_quiet),
            "tq_get": (None, one.tq_get_all),
            "raw_write": (
                lambda: one.raw_path.unlink(missing_ok=True),
                lambda: asyncio.to_thread(raw_write, one.raw_path, one.live),
            ),
        },
    )
    for d in one.base.glob("cpu_save*"):
        shutil.rmtree(d)
    return out


def _restore_before(tq: Any, sdir: Path) -> Any:
    """The restore as it was before issue 30: each part read whole into a fresh buffer, 8 segments read ahead (the
    bench's streams run in this process, so the patch reaches them)."""
    from sc_app.data_plane import stream_io
    from sc_app.data_plane.streamed import load_streamed
    from sc_app.data_plane.streamed_format import iter_groups

    def whole_parts(directory: Path, doc: Any, stream: int, buffers: Any = None) -> Any:
        return iter_groups(directory, doc, stream)

    saved = stream_io.iter_groups, stream_io.READ_AHEAD
    stream_io.iter_groups, stream_io.READ_AHEAD = whole_parts, 8
    try:
        return load_streamed(tq, sdir)
    finally:
        stream_io.iter_groups, stream_io.READ_AHEAD = saved


async def restores(one: Any, meter: cpu.CpuMeter, sdir: Path, in_memory: list[Any]) -> dict[str, list[cpu.Sample]]:
    """The streamed restore of ``sdir`` (page cache dropped) now and before issue 30 (whole parts, fresh buffers),
    TransferQueue's own put of ``in_memory`` and a raw read, ``one.reps`` times each."""
    from sc_app.data_plane.streamed import load_streamed

    return await cpu.interleave(
        meter,
        one.reps,
        {
            "restore": (
                lambda: (one.h.clear_all(), drop_cache(files_under(sdir))),
                lambda: asyncio.to_thread(load_streamed, one.tq, sdir),
            ),
            "restore_before": (
                lambda: (one.h.clear_all(), drop_cache(files_under(sdir))),
                lambda: asyncio.to_thread(_restore_before, one.tq, sdir),
            ),
            "tq_put": (one.h.clear_all, lambda: one.tq_put_all(in_memory)),
            "raw_read": (None, lambda: asyncio.to_thread(raw_read, one.raw_path)),
        },
    )
