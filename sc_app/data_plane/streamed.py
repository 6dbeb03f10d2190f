"""The streamed data-plane snapshot: capture rows inside the barrier window, copy them to disk after it; restore
them with one put per group. No pickle anywhere.

The format of the files is ``sc_app.data_plane.streamed_format`` (described in ``docs/checkpoint.md``). Writing
after the window is correct because the caller keeps the freeze (``sc_app/replay_buffer.py``) until it ends.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.background import run_blocking
from sc_app.data_plane.client import METADATA_FILE, CapturedRows, DataPlaneSnapshot
from sc_app.data_plane.streamed_format import (
    PART_BYTES,
    PartWriter,
    RestoredGroup,
    StreamedFormatError,
    group_ids,
    iter_groups,
    read_metadata,
    write_metadata,
)

log = logging.getLogger(__name__)

GETS_IN_FLIGHT = 2  # group reads overlapping the file writes
GET_BYTES = 4 * 1024 * 1024  # small groups share a get up to about this many bytes
MAX_GROUPS_PER_GET = 64
PUTS_IN_FLIGHT = 2  # group puts overlapping the file reads on restore


@dataclass
class StreamedSnapshot(DataPlaneSnapshot):
    """Rows captured inside the barrier window; ``write()`` copies them to ``directory`` after it.

    Pre: the freeze (``sc_app/replay_buffer.py``) holds from ``capture`` until ``write()`` returns. ``field_names``
    are the names each group held at capture; a group missing from it, or mapped to ``None``, has every field it
    holds read. Rows added meanwhile are never read.
    Post of ``write()``: ``directory`` holds exactly the captured rows and fields, every file fsynced,
    ``metadata.json`` last; the returned ``files`` hold the sha256 of every file written.
    """

    tq: Any
    directory: Path
    partition: str
    groups: dict[str, list[str]]
    metadata: dict[str, Any]
    field_names: dict[str, list[str] | None] | None = None
    tags: dict[str, dict[str, Any]] | None = None
    part_bytes: int = PART_BYTES
    gets_in_flight: int = GETS_IN_FLIGHT

    @classmethod
    def capture(
        cls, tq: Any, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows, **kw: Any
    ) -> StreamedSnapshot:
        """Record which rows (and fields, tags) form the snapshot. No I/O and no data-plane call."""
        groups = group_ids(list(captured.sample_ids))
        field_names, tags = captured.field_names, captured.tags
        if tags is not None:
            tags = {sid: dict(tags[sid]) for ids in groups.values() for sid in ids}
        if field_names is not None:
            field_names = {gid: None if (names := field_names.get(gid)) is None else list(names) for gid in groups}
        return cls(tq, Path(directory), partition, groups, dict(metadata), field_names, tags, **kw)

    @property
    def rows(self) -> int:
        return sum(len(ids) for ids in self.groups.values())

    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        blocking = functools.partial(run_blocking, executor)

        # never parents: the bundle's tmp dir must still be where its writer made it (a new lease holder may have
        # moved a fenced-off writer's tmp dir aside; recreating it would collide with the holder's own save)
        self.directory.mkdir(exist_ok=True)
        if any(self.directory.iterdir()):
            raise FileExistsError(f"{self.directory}: not empty; a streamed snapshot writes into an empty directory")
        tags: dict[str, Any] = self.tags or {}
        if self.groups and self.tags is None:
            listing = await self.tq.async_kv_list(partition_id=self.partition)
            tags = listing.get(self.partition, {})
        missing = [sid for ids in self.groups.values() for sid in ids if sid not in tags]
        if missing:
            raise RuntimeError(
                f"{len(missing)} captured rows (e.g. {missing[0]!r}) left partition {self.partition!r} before the "
                "snapshot was written; captured rows must not be cleared until write() returns"
            )
        writer = PartWriter(self.directory, self.part_bytes)
        try:
            await self._copy(writer, tags, blocking)
            await blocking(writer.finish)
        except BaseException:
            writer.abandon()
            raise
        doc = writer.metadata(partition=self.partition, user_metadata=self.metadata)
        files = dict(writer.hashes)
        files[METADATA_FILE] = await blocking(write_metadata, self.directory, doc)
        seconds = time.perf_counter() - started
        size = sum(f["size"] for f in files.values())
        log.info("streamed snapshot: %d rows, %d bytes in %.3fs to %s", self.rows, size, seconds, self.directory)
        return {"bytes": size, "rows": self.rows, "seconds": seconds, "files": files}

    def _select(self, gid: str) -> list[str] | None:
        return None if self.field_names is None else self.field_names.get(gid)

    async def _copy(self, writer: PartWriter, tags: dict[str, Any], blocking: Callable[..., Awaitable[Any]]) -> None:
        """Fetch groups in order with a few gets in flight; append them to the parts in a worker thread.

        Small groups are fetched several per get (the RPC, not the bytes, is their cost): only groups with the
        same captured field list share a get, so every row holds every selected field and TransferQueue's
        multi-key get (which returns the fields *all* rows have) cannot drop one. A group of unknown fields is
        fetched alone. How many share a get is sized from the first group's bytes (``GET_BYTES``)."""
        items = list(self.groups.items())
        pos = 0
        per_get = 1
        pending: deque[tuple[list[tuple[str, list[str]]], asyncio.Task[Any]]] = deque()

        def next_batch() -> tuple[list[tuple[str, list[str]]], asyncio.Task[Any]]:
            nonlocal pos
            select = self._select(items[pos][0])
            batch = [items[pos]]
            pos += 1
            while select is not None and len(batch) < per_get and pos < len(items):
                if self._select(items[pos][0]) != select:
                    break
                batch.append(items[pos])
                pos += 1
            keys = [sid for _, ids in batch for sid in ids]
            get = self.tq.async_kv_batch_get(keys=keys, partition_id=self.partition, select_fields=select)
            return batch, asyncio.ensure_future(get)

        try:
            while pos < len(items) or pending:
                while pos < len(items) and len(pending) < max(1, self.gets_in_flight):
                    pending.append(next_batch())
                batch, task = pending.popleft()
                td = await task
                rows = sum(len(ids) for _, ids in batch)
                if td.batch_size[0] != rows:
                    raise RuntimeError(f"groups {batch[0][0]}..: read back {td.batch_size[0]} rows, captured {rows}")
                if per_get == 1 and len(batch) == 1:
                    per_get = max(1, min(MAX_GROUPS_PER_GET, GET_BYTES // max(1, _td_bytes(td))))
                segments = [
                    (gid, ids, [dict(tags[sid]) for sid in ids], part) for (gid, ids), part in _split(td, batch)
                ]
                await blocking(writer.append_all, segments)
        finally:
            for _, t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*(t for _, t in pending), return_exceptions=True)


def _td_bytes(td: TensorDict) -> int:
    total = 0
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        v = td.get(key)
        if isinstance(v, torch.Tensor):
            v = v.values() if v.is_nested else v
            total += v.numel() * v.element_size()
    return total


def _split(td: TensorDict, batch: list[tuple[str, list[str]]]) -> Iterator[tuple[tuple[str, list[str]], TensorDict]]:
    """The rows of each group of ``batch`` (in order) out of one get's result."""
    if len(batch) == 1:
        yield batch[0], td
        return
    columns = {}
    for key in td.keys():  # noqa: SIM118
        v = td.get(key)
        columns[str(key)] = list(v.unbind()) if isinstance(v, torch.Tensor) and v.is_nested else v
    start = 0
    for gid, ids in batch:
        end = start + len(ids)
        data = {}
        for key, col in columns.items():
            if isinstance(col, list):
                rows = col[start:end]
                same = all(r.shape == rows[0].shape for r in rows)
                data[key] = torch.stack(rows) if same else torch.nested.nested_tensor(rows, layout=torch.jagged)
            else:
                data[key] = col[start:end]
        yield (gid, ids), TensorDict(data, batch_size=len(ids))
        start = end


def _prefetched(it: Iterator[RestoredGroup], depth: int = 8) -> Iterator[RestoredGroup]:
    """Run ``it`` in a thread, ``depth`` groups ahead (file reads overlap the puts)."""
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


def load_streamed(tq: Any, directory: Path, *, puts_in_flight: int = PUTS_IN_FLIGHT) -> dict[str, Any]:
    """Put every stored group back into TransferQueue, one put per group, tags restored; returns ``metadata.json``.

    Pre: the caller checked the data plane is untouched. Post: the partition holds exactly the stored rows.
    Runs its own event loop in a worker thread, so it may be called with or without a running loop.
    """
    doc = read_metadata(Path(directory))
    result: dict[str, Any] = {}

    async def run() -> None:
        rows = groups = 0
        inflight: set[asyncio.Task[Any]] = set()
        for group in _prefetched(iter_groups(Path(directory), doc)):
            while len(inflight) >= max(1, puts_in_flight):
                finished, inflight_left = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                for t in finished:
                    t.result()
                inflight = set(inflight_left)
            put = tq.async_kv_batch_put(
                keys=group.ids, partition_id=doc["partition"], fields=group.data, tags=group.tags
            )
            inflight.add(asyncio.ensure_future(put))
            rows += len(group.ids)
            groups += 1
        for t in asyncio.as_completed(inflight):
            await t
        result.update(rows=rows, groups=groups)

    box: list[BaseException] = []

    def thread_main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            box.append(exc)

    t = threading.Thread(target=thread_main, name="streamed-restore", daemon=True)
    t.start()
    t.join()
    if box:
        raise box[0]
    if result.get("rows") != doc.get("rows") or result.get("groups") != doc.get("groups"):
        raise StreamedFormatError(
            f"{directory}: restored {result.get('rows')} rows in {result.get('groups')} groups, metadata.json "
            f"lists {doc.get('rows')} rows in {doc.get('groups')} groups"
        )
    return doc
