"""One stream of the streamed snapshot: the rows of one storage unit, copied to (or restored from) part files of
their own. ``sc_app.data_plane.streamed`` runs one stream per unit, concurrently — in this process, or in a
``StreamWorker`` actor placed on the unit's node when that node sees the same checkpoint volume.

Rows are read and written through TransferQueue's own client with metadata the caller already holds (global
indexes from one lookup for the whole snapshot), so a stream makes no controller lookup per get or put; several
small segments share one get. No per-row Python work on the copy path: segments are split out of a get's result
by slicing the field tensors.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import queue
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
from tensordict import TensorDict

from sc_app.data_plane import units
from sc_app.data_plane.part_buffers import PartBuffers
from sc_app.data_plane.streamed_format import PartWriter, RestoredGroup, iter_groups, stream_parts
from sc_app.io.safe_files import FileProblem, open_regular

log = logging.getLogger(__name__)

GETS_IN_FLIGHT = 2  # segment reads overlapping the file writes, per stream
GET_BYTES = 4 * 1024 * 1024  # small segments share a get up to about this many bytes
MAX_SEGMENTS_PER_GET = 64
PUTS_IN_FLIGHT = 2  # segment puts overlapping the file reads on restore, per stream
READ_AHEAD = 2  # segments read ahead of the puts on restore (the kernel reads the files ahead: ``read_ahead``)

Blocking = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Segment:
    """Rows of one group that one unit holds, to copy: ids, their global indexes and tags, and the fields to read
    (``None``: every field the rows hold, which TransferQueue looks up for this segment alone)."""

    group: str
    ids: list[str]
    global_indexes: list[int]
    tags: list[dict[str, Any]]
    fields: list[str] | None


@dataclass(frozen=True)
class RowColumns:
    """Rows as field → one value per row (``units.get_rows``), ``rows`` of them."""

    columns: dict[str, list[Any]]
    rows: int

    def nbytes(self) -> int:
        values = (v for c in self.columns.values() for v in c if isinstance(v, torch.Tensor))
        return sum(v.numel() * v.element_size() for v in values)

    def split(self, counts: list[int]) -> list[dict[str, list[Any]]]:
        bounds = [0, *itertools.accumulate(counts)]
        return [{k: col[a:b] for k, col in self.columns.items()} for a, b in itertools.pairwise(bounds)]


class RowSource:
    """The TransferQueue calls a stream makes (tests wrap it to interleave other work between reads)."""

    def __init__(self, tq: Any, partition: str) -> None:
        self.tq = tq
        self.partition = partition
        self.client = units.tq_client(tq)

    async def get(self, segments: list[Segment]) -> TensorDict | RowColumns:
        """The rows of ``segments`` (which share one field list), in order: per-row values as the storage units
        sent them (``units.get_rows``: no packing copy) where the fields are known, else TransferQueue's get."""
        fields = segments[0].fields
        if fields is None:
            keys = [sid for seg in segments for sid in seg.ids]
            return await self.tq.async_kv_batch_get(keys=keys, partition_id=self.partition)
        gis = [gi for seg in segments for gi in seg.global_indexes]
        return RowColumns(await units.get_rows(self.client, gis, list(fields)), len(gis))

    async def put(self, group: RestoredGroup, global_indexes: list[int]) -> None:
        """Put one restored segment onto rows already registered at ``global_indexes``, tags included; then its
        pooled buffer may be reused (only after a put that completed: the storage unit has the bytes)."""
        meta = units.batch_meta(self.partition, global_indexes)
        meta.update_custom_meta(group.tags)
        await self.client.async_put(group.data, meta)
        group.release()


# ------------------------------------------------------------------------------------------------ copy (save)
async def copy_stream(
    source: RowSource,
    writer: PartWriter,
    segments: list[Segment],
    blocking: Blocking,
    *,
    gets_in_flight: int = GETS_IN_FLIGHT,
    get_bytes: int = GET_BYTES,
) -> None:
    """Read ``segments`` in order, a few gets in flight, and append them to ``writer`` (via ``blocking``).

    Only segments with the same field list share a get, so every row holds every selected field and a multi-row
    get cannot drop one; a segment of unknown fields is read alone. How many share a get is sized from the first
    segment's bytes (``get_bytes``)."""
    pos = 0
    per_get = 1
    pending: deque[tuple[list[Segment], asyncio.Task[Any]]] = deque()

    def next_batch() -> tuple[list[Segment], asyncio.Task[Any]]:
        nonlocal pos
        first = segments[pos]
        batch = [first]
        pos += 1
        while first.fields is not None and len(batch) < per_get and pos < len(segments):
            if segments[pos].fields != first.fields:
                break
            batch.append(segments[pos])
            pos += 1
        return batch, asyncio.ensure_future(source.get(batch))

    try:
        while pos < len(segments) or pending:
            while pos < len(segments) and len(pending) < max(1, gets_in_flight):
                pending.append(next_batch())
            batch, task = pending.popleft()
            got = await task
            rows = sum(len(seg.ids) for seg in batch)
            packed = not isinstance(got, RowColumns)
            read = got.batch_size[0] if packed else got.rows
            if read != rows:
                raise RuntimeError(f"segments {batch[0].group}..: read back {read} rows, captured {rows}")
            if per_get == 1 and len(batch) == 1:
                nbytes = td_bytes(got) if packed else got.nbytes()
                per_get = max(1, min(MAX_SEGMENTS_PER_GET, get_bytes // max(1, nbytes)))
            counts = [len(seg.ids) for seg in batch]
            parts = split_rows(got, counts) if packed else got.split(counts)
            segs = [(seg.group, seg.ids, seg.tags, part) for seg, part in zip(batch, parts, strict=True)]
            await blocking(writer.append_all, segs)
    finally:
        for _, t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*(t for _, t in pending), return_exceptions=True)


async def write_stream(
    source: RowSource,
    directory: Path,
    prefix: str,
    segments: list[Segment],
    part_bytes: int,
    *,
    thread: str,
    gets_in_flight: int = GETS_IN_FLIGHT,
) -> PartWriter:
    """Copy ``segments`` into the part files ``<prefix>-*`` under ``directory``, written on a thread of this stream's
    own (so streams write in parallel); the finished writer. On any failure its files are removed first."""
    from sc_app.io.background import background_executor, run_blocking

    writer = PartWriter(directory, part_bytes, prefix)
    pool = background_executor(thread)
    try:
        blocking = functools.partial(run_blocking, pool)
        await copy_stream(source, writer, segments, blocking, gets_in_flight=gets_in_flight)
        await run_blocking(pool, writer.finish)
    except BaseException:
        writer.abandon()
        raise
    finally:
        pool.shutdown(wait=False)
    return writer


def td_bytes(td: TensorDict) -> int:
    total = 0
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        v = td.get(key)
        if isinstance(v, torch.Tensor):
            v = v.values() if v.is_nested else v
            total += v.numel() * v.element_size()
    return total


def split_rows(td: TensorDict, counts: list[int]) -> list[TensorDict]:
    """``td``'s rows cut into consecutive runs of ``counts`` rows, by slicing (views; jagged fields by their
    offsets), never row by row — except a strided nested field (rows differing beyond their first dimension)."""
    if len(counts) == 1:
        return [td]
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    columns: dict[str, list[Any]] = {}
    for key in td.keys():  # noqa: SIM118
        columns[str(key)] = _cut(td.get(key), bounds)
    return [TensorDict({k: col[i] for k, col in columns.items()}, batch_size=counts[i]) for i in range(len(counts))]


def _cut(value: Any, bounds: list[int]) -> list[Any]:
    if not (isinstance(value, torch.Tensor) and value.is_nested):
        return [value[a:b] for a, b in itertools.pairwise(bounds)]
    if value.layout == torch.jagged:
        values, offsets = value.values(), value.offsets()
        out = []
        for a, b in itertools.pairwise(bounds):
            lo, hi = int(offsets[a]), int(offsets[b])
            out.append(torch.nested.nested_tensor_from_jagged(values[lo:hi], offsets=offsets[a : b + 1] - lo))
        return out
    rows = list(value.unbind())
    return [torch.nested.nested_tensor(rows[a:b]) for a, b in itertools.pairwise(bounds)]


# ------------------------------------------------------------------------------------------------ restore
def prefetched(it: Iterator[RestoredGroup], depth: int = 8) -> Iterator[RestoredGroup]:
    """Run ``it`` in a thread, ``depth`` items ahead (file reads overlap the puts)."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run() -> None:
        try:
            for item in it:
                if stop.is_set():
                    return
                q.put(item)
            q.put(done)
        except BaseException as exc:  # handed to the consumer
            q.put(exc)

    t = threading.Thread(target=run, name="streamed-restore-reader", daemon=True)
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():  # unblock a reader waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)


def read_ahead(directory: Path, parts: list[str]) -> None:
    """Ask the kernel to start reading the stream's part files now (``iter_groups`` reads one part at a time): the
    disk reads of later parts run while the first segments are put. Regular files only, no link followed."""
    for name in parts:
        try:
            fd = open_regular(directory / f"{name}.bin")
        except FileProblem:
            continue  # iter_groups names the problem
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


async def restore_stream(
    source: RowSource,
    directory: Path,
    doc: dict[str, Any],
    stream: int,
    global_indexes: list[int],
    *,
    puts_in_flight: int = PUTS_IN_FLIGHT,
) -> dict[str, int]:
    """Put every segment of stream ``stream`` back, one put per segment, onto the rows registered at
    ``global_indexes`` (the stream's row ids in file order); returns ``{"rows", "segments"}``. Every part is
    checked (``iter_groups``) before its bytes become tensors."""
    parts = stream_parts(doc)[stream]
    rows = segments = 0
    inflight: set[asyncio.Task[Any]] = set()
    # not awaited: the kernel may submit the reads synchronously, and the puts should start at once
    threading.Thread(target=read_ahead, args=(Path(directory), parts), name="restore-readahead", daemon=True).start()
    try:
        for group in prefetched(iter_groups(Path(directory), doc, stream, buffers=PartBuffers()), READ_AHEAD):
            while len(inflight) >= max(1, puts_in_flight):
                finished, left = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                for t in finished:
                    t.result()
                inflight = set(left)
            n = len(group.ids)
            if rows + n > len(global_indexes):
                raise RuntimeError(f"{directory}: stream holds more rows than its headers listed")
            inflight.add(asyncio.ensure_future(source.put(group, global_indexes[rows : rows + n])))
            rows += n
            segments += 1
        for t in asyncio.as_completed(inflight):
            await t
        inflight = set()
    finally:
        for t in inflight:
            t.cancel()
    return {"rows": rows, "segments": segments}


# ------------------------------------------------------------------------------------------------ placement
@ray.remote(num_cpus=0)
class StreamWorker:
    """Runs snapshot streams on one node (the node of the storage unit whose rows it copies or restores)."""

    def __init__(self) -> None:
        import transfer_queue as tq

        from sc_app.data_plane import tq_fastpath

        tq_fastpath.install(tq)
        tq.init()  # attaches to the running TransferQueue
        self.tq = tq

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def sees(self, directory: str, marker: str) -> bool:
        """True when ``directory/marker`` exists here: this node sees the same checkpoint volume."""
        return (Path(directory) / marker).exists()

    async def copy(
        self, directory: str, partition: str, prefix: str, segments: list[Segment], part_bytes: int
    ) -> dict[str, Any]:
        source = RowSource(self.tq, partition)
        writer = await write_stream(source, Path(directory), prefix, segments, part_bytes, thread="stream-write")
        return writer.summary()

    async def restore(
        self, directory: str, doc: dict[str, Any], stream: int, global_indexes: list[int]
    ) -> dict[str, int]:
        return await restore_stream(RowSource(self.tq, doc["partition"]), Path(directory), doc, stream, global_indexes)


_workers: dict[str, Any] = {}  # node id -> StreamWorker of this process


def worker_on(node_id: str) -> Any:
    """This process's ``StreamWorker`` on ``node_id`` (created on first use, kept for later snapshots)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_id not in _workers:
        _workers[node_id] = StreamWorker.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote()
    return _workers[node_id]


def shutdown_workers() -> None:
    """Kill the stream workers this process started."""
    while _workers:
        _, handle = _workers.popitem()
        try:
            ray.kill(handle)
        except Exception:  # already gone
            log.debug("stream worker already gone", exc_info=True)
