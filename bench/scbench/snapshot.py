"""Sections 1-3: data-plane save and restore against their ceilings; bundle size after churn; the commit stall.

Per size (1 MiB rows, 8-row groups, after churn), repetitions interleave every candidate:

* saves — the streamed snapshot (one stream per storage unit), the streamed snapshot as it was before issue 12
  (``BEFORE_COMMIT``, read from git; one stream, a controller lookup per get), TransferQueue's native save (1 unit,
  up to ``NATIVE_MAX_MIB``), and the two halves of the save's ceiling: a raw write + fsync of the same bytes, and
  TransferQueue's own get of the same rows (``async_kv_batch_get`` one group per get, two in flight, no disk).
  The ceiling of a save is the slower of the two;
* restores — the streamed restore (now and before), the native restore, and the ceiling's halves: a raw read of
  the same bytes (page cache dropped) and TransferQueue's own put of the same rows (``async_kv_batch_put`` one
  group per put, two in flight, the tensors already in memory). The ceiling of a restore is the slower of the two.

Every save runs the way ``SingleControllerActor`` cuts one (window: index, ``list_samples()`` == index, capture
with field names and tags, freeze; ``write()`` after it; ``thaw()``), with a small rollout group committed every 5 ms
through the same barrier (its waits are the commit stall). Every restore is checked: same row set, one group's
bytes and tags exactly.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.scbench import cpu, snapshot_cpu
from bench.scbench.common import (
    GROUP,
    NATIVE_MAX_MIB,
    ROW_BYTES,
    STREAM_GROUP_BYTES,
    STREAM_INTERVAL_S,
    TWO_UNIT_MAX_MIB,
    Harness,
    MiB,
    before_module,
    check,
    drop_cache,
    files_under,
    percentile,
    raw_read,
    raw_write,
    summary,
    tree_bytes,
)

IN_FLIGHT = 2  # TransferQueue's own gets/puts of the ceilings: as many in flight as the snapshot keeps per stream


def run(h: Harness, units: int) -> list[dict[str, Any]]:
    h.use_units(units)
    before = before_module("sc_app/data_plane/streamed.py")
    sizes = h.sizes if units == 1 else [s for s in h.sizes if s <= TWO_UNIT_MAX_MIB]
    rows = []
    for size in sizes:
        print(f"[snapshot] {units} unit(s), {size} MiB ...", flush=True)
        rows.append(asyncio.run(_size(h, size, units, before)))
        h.clear_all()
    return rows


async def _size(h: Harness, size_mib: int, units: int, before: Any) -> dict[str, Any]:
    one = OneSize(h, size_mib, units, before)
    fill_s = await one.churn()
    saves, raw_w, tq_get = await one.measure_saves()
    one.meter.calibrate(0.3 if h.quick else 1.0)  # the tree at rest, right before its CPU is measured
    one.cpu_samples.update(await snapshot_cpu.saves(one, one.meter))
    restore = await one.measure_restores()
    return one.result(fill_s, saves, raw_w, tq_get, restore)


Snap = Callable[[Path, dict[str, Any], dict[str, Any]], Awaitable[Any]]


class OneSize:
    """One data-plane size: the live rows after churn, then its saves, restores and their ceilings."""

    def __init__(self, h: Harness, size_mib: int, units: int, before: Any) -> None:
        from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
        from sc_app.data_plane.replay_buffer import TQReplayBuffer

        self.h, self.size_mib, self.units, self.before = h, size_mib, units, before
        self.tq = h.tq
        self.client = h.client()
        self.barrier = DataPlaneCheckpointBarrier()
        self.partition = f"dp{size_mib}u{units}"
        self.buffer = TQReplayBuffer(self.client, self.barrier, partition=self.partition, group_size=GROUP)
        self.per_row = ROW_BYTES // 4 - 1  # float32 payload + one float32 reward = ROW_BYTES per row
        self.live_groups = max(1, size_mib * MiB // (ROW_BYTES * GROUP))
        self.counter = 0
        self.reps = 1 if h.quick else (2 if size_mib >= 1024 else 3)
        self.base = h.work / f"dp{size_mib}u{units}"
        self.raw_path = self.base / "raw.bin"
        self.live = 0
        self.meter = cpu.CpuMeter()
        self.cpu_samples: dict[str, list[cpu.Sample]] = {}  # CPU cost (``snapshot_cpu``) by candidate

    def group_fields(self, seed: int) -> Any:
        import torch
        from tensordict import TensorDict

        x = torch.empty(GROUP, self.per_row, dtype=torch.float32)
        x.fill_(float(seed))
        x[:, :4] = torch.arange(4, dtype=torch.float32) + seed
        return TensorDict({"x": x, "reward": torch.full((GROUP,), float(seed))}, batch_size=GROUP)

    async def commit_new(self, n: int) -> None:
        from sc_app.data_plane.replay_buffer import GroupCommit

        for _ in range(n):
            c = self.counter
            await self.buffer.commit_groups([GroupCommit(f"g{c}", c, c)], self.group_fields(c))
            self.counter += 1

    async def churn(self) -> float:
        """Fill, then rounds of "drop the oldest half, commit as many new groups" (what training does); returns
        the fill's seconds."""
        t0 = time.perf_counter()
        await self.commit_new(self.live_groups)
        fill_s = time.perf_counter() - t0
        for _ in range(2):
            old = [g.group_id for g in self.buffer.groups()[: max(1, self.live_groups // 2)]]
            await self.buffer.drop(old)
            await self.commit_new(len(old))
        check(self.buffer.rows == self.live_groups * GROUP, "churn changed the number of live rows")
        self.live = self.buffer.rows * ROW_BYTES
        return fill_s

    # ------------------------------------------------------------------------------------------- saves
    def streamed_now(self, kind: str) -> Snap:
        from sc_app.data_plane.client import CapturedRows

        async def make(directory: Path, meta: dict[str, Any], listed: dict[str, Any]) -> Any:
            self.client.snapshot = kind
            captured = CapturedRows(sorted(listed), self.buffer.field_names_by_group(), listed)
            return await self.client.save_checkpoint(directory, meta, self.partition, captured)

        return make

    async def streamed_before(self, directory: Path, meta: dict[str, Any], listed: dict[str, Any]) -> Any:
        from sc_app.data_plane.client import CapturedRows

        captured = CapturedRows(sorted(listed), self.buffer.field_names_by_group(), listed)
        return self.before.StreamedSnapshot.capture(self.tq, directory, meta, self.partition, captured)

    async def stream(self, stream_buffer: Any, stop: asyncio.Event, latencies: list[float]) -> None:
        """Small rollout groups committing every ``STREAM_INTERVAL_S`` through the same barrier until ``stop``."""
        import torch
        from tensordict import TensorDict

        small = TensorDict({"y": torch.zeros(GROUP, STREAM_GROUP_BYTES // GROUP // 4)}, batch_size=GROUP)
        i = 0
        while not stop.is_set():
            t = time.perf_counter()
            await stream_buffer.commit(f"s{uuid.uuid4().hex[:8]}", i, 0, small)
            latencies.append(time.perf_counter() - t)
            i += 1
            await asyncio.sleep(STREAM_INTERVAL_S)

    async def save(self, make: Snap, directory: Path, rollouts: bool = True) -> dict[str, Any]:
        """One save the way the controller cuts it, with small rollout groups committing meanwhile (``rollouts``;
        off where the save's own CPU is measured)."""
        from sc_app.data_plane.replay_buffer import TQReplayBuffer

        buffer, barrier = self.buffer, self.barrier
        waits_before = len(barrier.stats.mutation_waits)
        stop = asyncio.Event()
        latencies: list[float] = []
        stream_buffer = TQReplayBuffer(self.client, barrier, partition=self.partition + "s", group_size=GROUP)
        streamer = asyncio.create_task(self.stream(stream_buffer, stop, latencies) if rollouts else asyncio.sleep(0))
        await asyncio.sleep(0.05 if rollouts else 0)  # the stream is flowing before the save asks for the window
        t0 = time.perf_counter()
        async with barrier.checkpoint():
            w0 = time.perf_counter()
            meta = buffer.metadata_state_dict()
            listed = await self.client.list_samples(self.partition)
            check(set(listed) == buffer.sample_ids(), "inventory mismatch before save")
            snap = await make(directory, {"digest": meta["digest"], "step": self.counter}, listed)
            window = time.perf_counter() - w0
            buffer.freeze(set(listed))
        try:
            stats = await snap.write()
        finally:
            await buffer.thaw()
        total = time.perf_counter() - t0
        await asyncio.sleep(0.05 if rollouts else 0)
        stop.set()
        await streamer
        waits = barrier.stats.mutation_waits[waits_before:]
        if stream_buffer.groups():
            await stream_buffer.drop([g.group_id for g in stream_buffer.groups()])  # the next save sees the same set
        return {
            "seconds": total,
            "window_s": window,
            "bundle_bytes": tree_bytes(directory),
            "commit_waits": waits,
            "commit_latencies": latencies,
            "rows": stats["rows"],
            "streams": stats.get("streams", 1),
        }

    async def tq_get_all(self) -> float:
        """TransferQueue's own client reading every live group (no disk): half of the save's ceiling."""
        keys = [list(g.sample_ids) for g in self.buffer.groups()]
        t0 = time.perf_counter()
        pending: list[asyncio.Task[Any]] = []
        for k in keys:
            pending.append(asyncio.ensure_future(self.tq.async_kv_batch_get(keys=k, partition_id=self.partition)))
            if len(pending) >= IN_FLIGHT:
                got = await pending.pop(0)
        for t in pending:
            got = await t
        secs = time.perf_counter() - t0
        check(got.batch_size[0] == GROUP, "TransferQueue's get returned other rows")
        return secs

    async def measure_saves(self) -> tuple[dict[str, list[dict[str, Any]]], list[float], list[float]]:
        """Every candidate's saves, interleaved per repetition with the ceiling's halves (raw write, TQ get)."""
        self.base.mkdir(parents=True, exist_ok=True)
        cands: dict[str, list[dict[str, Any]]] = {"streamed": [], "before": [], "native": []}
        raw_w: list[float] = []
        tq_get: list[float] = []
        run_native = self.units == 1 and self.size_mib <= NATIVE_MAX_MIB
        for r in range(self.reps):
            makers = (("streamed", self.streamed_now("streamed")), ("before", self.streamed_before), ("native", None))
            for name, make in makers:
                if (name == "before" and self.before is None) or (name == "native" and not run_native):
                    continue
                d = self.base / f"{name}{r}"
                cands[name].append(await self.save(make or self.streamed_now("native"), d))
                if r < self.reps - 1:
                    shutil.rmtree(d)
            self.client.snapshot = "streamed"
            if self.raw_path.exists():
                self.raw_path.unlink()
            raw_w.append(await asyncio.to_thread(raw_write, self.raw_path, self.live))
            tq_get.append(await self.tq_get_all())
        check(all(s["rows"] == self.live_groups * GROUP for s in cands["streamed"]), "streamed snapshot row count")
        return cands, raw_w, tq_get

    # ------------------------------------------------------------------------------------------- restores
    def check_restored(self, probe: str, what: str, ids_on_disk: list[str], expected: dict[str, int]) -> None:
        import torch

        listing = self.tq.kv_list(self.partition).get(self.partition, {})
        check(set(listing) == set(ids_on_disk), f"{what}: restored rows != snapshot rows")
        got = self.tq.kv_batch_get(keys=[f"{probe}:{i}" for i in range(GROUP)], partition_id=self.partition)
        want = self.group_fields(expected[probe])
        check(bool(torch.equal(got["reward"], want["reward"])), f"{what}: restored reward differs")
        xv = got["x"].values() if got["x"].is_nested else got["x"].reshape(-1)
        check(bool(torch.equal(xv.reshape(GROUP, -1), want["x"])), f"{what}: restored payload differs")
        check(listing[f"{probe}:0"] == {"group": probe, "version": expected[probe]}, f"{what}: restored tags differ")

    async def tq_put_all(self, in_memory: list[Any]) -> float:
        """TransferQueue's own put of exactly the snapshot's tensors, already in memory: half of the restore's
        ceiling."""
        t0 = time.perf_counter()
        pending: list[asyncio.Task[Any]] = []
        for g in in_memory:
            put = self.tq.async_kv_batch_put(keys=g.ids, partition_id=self.partition, fields=g.data, tags=g.tags)
            pending.append(asyncio.ensure_future(put))
            if len(pending) >= IN_FLIGHT:
                await pending.pop(0)
        for t in pending:
            await t
        return time.perf_counter() - t0

    async def restore_one(self, name: str, directory: Path) -> float:
        from sc_app.data_plane.streamed import load_streamed

        self.h.clear_all()
        drop_cache(files_under(directory))
        t0 = time.perf_counter()
        if name == "streamed":
            await asyncio.to_thread(load_streamed, self.tq, directory)
        elif name == "before":
            await asyncio.to_thread(self.before.load_streamed, self.tq, directory)
        else:
            await asyncio.to_thread(self.tq.load_checkpoint, str(directory))
        return time.perf_counter() - t0

    async def measure_restores(self) -> dict[str, list[float]]:
        """Every candidate's restore of its last save, checked, interleaved with the ceiling's halves."""
        from sc_app.data_plane.streamed_format import RestoredGroup, iter_groups

        last = self.reps - 1
        sdir = self.base / f"streamed{last}"
        ids_on_disk = [sid for g in iter_groups(sdir) for sid in g.ids]
        check(set(ids_on_disk) == self.buffer.sample_ids(), "streamed snapshot != captured index")
        check(len(ids_on_disk) == len(set(ids_on_disk)), "streamed snapshot repeats a row")
        expected = {g.group_id: int(g.group_id[1:]) for g in self.buffer.groups()}
        # copied out of the mapped files, for TransferQueue's own put
        in_memory = [RestoredGroup(g.group, g.ids, g.tags, g.data.clone()) for g in iter_groups(sdir)]
        restore: dict[str, list[float]] = {"streamed": [], "before": [], "native": [], "tq_put": [], "raw_read": []}
        for r in range(self.reps):
            probe = sorted(expected)[r % len(expected)]
            for name in ("streamed", "before", "native"):
                directory = self.base / f"{name}{last}"
                if not directory.exists():
                    continue
                restore[name].append(await self.restore_one(name, directory))
                if name == "native":
                    rows = self.tq.kv_list(self.partition).get(self.partition, {})
                    check(len(rows) == len(ids_on_disk), "native restore rows")
                else:
                    self.check_restored(probe, f"{name} restore", ids_on_disk, expected)
            self.h.clear_all()
            restore["tq_put"].append(await self.tq_put_all(in_memory))
            self.check_restored(probe, "TransferQueue's own put", ids_on_disk, expected)
            restore["raw_read"].append(await asyncio.to_thread(raw_read, self.raw_path))
        self.cpu_samples.update(await snapshot_cpu.restores(self, self.meter, sdir, in_memory))
        self.h.clear_all()
        shutil.rmtree(self.base)
        return restore

    # ------------------------------------------------------------------------------------------- the row
    def result(
        self,
        fill_s: float,
        cands: dict[str, list[dict[str, Any]]],
        raw_w: list[float],
        tq_get: list[float],
        restore: dict[str, list[float]],
    ) -> dict[str, Any]:
        live = self.live
        out: dict[str, Any] = {
            "size_mib": self.size_mib,
            "units": self.units,
            "live_bytes": live,
            "groups": self.live_groups,
            "fill_mib_s": live / fill_s / MiB,
            "raw_write_mib_s": _bw(live, raw_w),
            "tq_get_mib_s": _bw(live, tq_get),
            "save_ceiling_mib_s": _ceiling(live, raw_w, tq_get),
            "raw_read_mib_s": _bw(live, restore["raw_read"]),
            "tq_put_mib_s": _bw(live, restore["tq_put"]),
            "restore_ceiling_mib_s": _ceiling(live, restore["raw_read"], restore["tq_put"]),
            "cpu": cpu.cost_rows(self.cpu_samples, live, self.meter.idle_rate),
        }
        for name in ("streamed", "before", "native"):
            if not cands[name]:
                continue
            c = _collect(live, cands[name])
            c["save_over_raw"] = c["save_mib_s"]["median"] / out["raw_write_mib_s"]["median"]
            c["save_over_ceiling"] = c["save_mib_s"]["median"] / out["save_ceiling_mib_s"]["median"]
            if restore[name]:
                c["restore_mib_s"] = _bw(live, restore[name])
                c["restore_over_raw"] = c["restore_mib_s"]["median"] / out["raw_read_mib_s"]["median"]
                c["restore_over_ceiling"] = c["restore_mib_s"]["median"] / out["restore_ceiling_mib_s"]["median"]
            out[name] = c
        return out


def _bw(live: int, secs: list[float]) -> dict[str, float]:
    return summary([live / s / MiB for s in secs])


def _ceiling(live: int, a: list[float], b: list[float]) -> dict[str, float]:
    """Per repetition, the slower of the two halves (they were measured side by side)."""
    return summary([live / max(x, y) / MiB for x, y in zip(a, b, strict=True)])


def _collect(live: int, saves: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [w for s in saves for w in s["commit_waits"]]
    lats = [x for s in saves for x in s["commit_latencies"]]
    return {
        "save_s": summary([s["seconds"] for s in saves]),
        "save_mib_s": _bw(live, [s["seconds"] for s in saves]),
        "window_ms": summary([s["window_s"] * 1e3 for s in saves]),
        "bundle_bytes": saves[-1]["bundle_bytes"],
        "bundle_over_live": saves[-1]["bundle_bytes"] / live,
        "commit_wait_ms": {"p50": percentile(waits, 50) * 1e3, "p99": percentile(waits, 99) * 1e3},
        "commit_latency_ms": {"p50": percentile(lats, 50) * 1e3, "p99": percentile(lats, 99) * 1e3},
        "commits_during_saves": len(waits),
        "streams": saves[-1]["streams"],
    }
