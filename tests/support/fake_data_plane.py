"""An in-memory ``DataPlaneClient`` for unit tests of pure logic (the replay buffer, the controller): no Ray, no
TransferQueue. It records every call and, when given the barrier, how many barrier slots were held during each
write; ``save_checkpoint`` captures the listed rows in memory (``FakeSnapshot``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneSnapshot


async def until(condition: Callable[[], bool], *, rounds: int = 10_000, seconds: float | None = None) -> None:
    """Yield to the event loop until ``condition()`` holds: deterministic synchronisation with the other tasks of
    this loop, failing after ``rounds`` turns of the loop rather than hanging. Where the condition also waits on a
    thread (the save's file work), pass ``seconds``: a generous bound on the wait, never a speed assertion."""
    if seconds is None:
        for _ in range(rounds):
            if condition():
                return
            await asyncio.sleep(0)
        raise AssertionError(f"condition still false after {rounds} turns of the event loop")
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition still false after {seconds} s")
        await asyncio.sleep(0.005)


class FakeSnapshot(DataPlaneSnapshot):
    """The rows a window captured, copied in memory; ``write()`` writes their ids and the metadata into the
    directory (``rows.json``) and hands the snapshot to the fake's ``snapshots``."""

    def __init__(self, owner: FakeDataPlane, directory: Path, metadata: dict[str, Any], rows: dict[str, Any]) -> None:
        self.owner, self.directory, self.metadata, self.rows = owner, directory, metadata, rows

    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        if self.owner.write_gate is not None:  # a slow disk: the write waits for the test
            await self.owner.write_gate.wait()
        self.directory.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"sample_ids": sorted(self.rows), "user_metadata": self.metadata}).encode()
        (self.directory / "rows.json").write_bytes(data)
        self.owner.snapshots.append(self)
        return {"bytes": len(data), "rows": len(self.rows), "seconds": 0.0, "files": {}}


class FakeDataPlane(DataPlaneClient):
    """In-memory client; records every call and whether a barrier slot was held during each write."""

    def __init__(self, barrier: DataPlaneCheckpointBarrier | None = None) -> None:
        self.bootstrap = False
        self.rows: dict[str, dict[str, torch.Tensor]] = {}
        self.calls: list[str] = []
        self.slots_during_writes: list[int] = []
        self.barrier = barrier
        self.tags: dict[str, dict[str, Any]] = {}
        self.put_keys: list[list[str]] = []
        self.put_gate: asyncio.Event | None = None  # when set, a put waits for it (after recording the call)
        self.fail_puts = False
        self.indexes: dict[str, int] | None = None  # set to {} to hand out global indexes like TransferQueue
        self.by_index: list[str] = []  # calls made with global indexes
        self._next_index = itertools.count()
        self.snapshots: list[FakeSnapshot] = []  # written by ``FakeSnapshot.write``
        self.write_gate: asyncio.Event | None = None  # when set, a snapshot's write waits for it

    def _write(self, op: str) -> None:
        self.calls.append(op)
        if self.barrier is not None:
            self.slots_during_writes.append(self.barrier.active_mutations)

    async def put_samples(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: list[dict[str, Any]] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> list[int] | None:
        self._write("put_samples")
        self.put_keys.append(list(sample_ids))
        if self.put_gate is not None:
            await self.put_gate.wait()
        await asyncio.sleep(0)
        if self.fail_puts:
            raise ConnectionError("storage unit unreachable")
        for i, sid in enumerate(sample_ids):
            self.rows.setdefault(sid, {}).update({k: data.get(k)[i] for k in data.keys()})  # noqa: SIM118
            if tags is not None:
                self.tags[sid] = dict(tags[i])
        if self.indexes is None:
            return None
        if global_indexes is not None:  # a put by index must name exactly these rows
            assert [self.indexes[sid] for sid in sample_ids] == global_indexes, "put by stale or wrong indexes"
            assert tags is not None, "a put by index must carry the tags"
            self.by_index.append("put")
        for sid in sample_ids:
            self.indexes.setdefault(sid, next(self._next_index))
        return [self.indexes[sid] for sid in sample_ids]

    async def get_samples(
        self,
        partition: str,
        sample_ids: list[str],
        field_names: list[str] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> TensorDict:
        self.calls.append("get_samples")
        keys = field_names or list(self.rows[sample_ids[0]])
        return TensorDict({k: torch.stack([self.rows[s][k] for s in sample_ids]) for k in keys}, [len(sample_ids)])

    async def clear_samples(
        self, partition: str, sample_ids: list[str], *, global_indexes: list[int] | None = None
    ) -> None:
        self._write("clear_samples")
        if global_indexes is not None:
            assert self.indexes is not None and [self.indexes[sid] for sid in sample_ids] == global_indexes
            self.by_index.append("clear")
        await asyncio.sleep(0)
        for sid in sample_ids:
            del self.rows[sid]
            if self.indexes is not None:
                del self.indexes[sid]

    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        self.calls.append("list_sample_ids")
        return {sid: {} for sid in self.rows}

    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        self.calls.append("save_checkpoint")
        rows = {sid: dict(self.rows[sid]) for sid in captured.sample_ids}
        return FakeSnapshot(self, directory, dict(metadata), rows)

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        raise NotImplementedError

    def seal(self, info: dict[str, Any]) -> None:
        self.calls.append("seal")
