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

from bench.scbench import cpu
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
    import torch
    from tensordict import TensorDict

    from sc_app.barrier import DataPlaneCheckpointBarrier
    from sc_app.data_plane.client import CapturedRows
    from sc_app.data_plane.streamed import load_streamed
    from sc_app.data_plane.streamed_format import RestoredGroup, iter_groups
    from sc_app.replay_buffer import GroupCommit, TQReplayBuffer

    tq = h.tq
    client = h.client()
    barrier = DataPlaneCheckpointBarrier()
    partition = f"dp{size_mib}u{units}"
    buffer = TQReplayBuffer(client, barrier, partition=partition, group_size=GROUP)
    per_row = ROW_BYTES // 4 - 1  # float32 payload + one float32 reward = ROW_BYTES per row
    live_groups = max(1, size_mib * MiB // (ROW_BYTES * GROUP))
    counter = 0

    def group_fields(seed: int) -> TensorDict:
        x = torch.empty(GROUP, per_row, dtype=torch.float32)
        x.fill_(float(seed))
        x[:, :4] = torch.arange(4, dtype=torch.float32) + seed
        return TensorDict({"x": x, "reward": torch.full((GROUP,), float(seed))}, batch_size=GROUP)

    async def commit_new(n: int) -> None:
        nonlocal counter
        for _ in range(n):
            await buffer.commit_groups([GroupCommit(f"g{counter}", counter, counter)], group_fields(counter))
            counter += 1

    # churn: fill, then rounds of "drop the oldest half, commit as many new groups" (what training does)
    t0 = time.perf_counter()
    await commit_new(live_groups)
    fill_s = time.perf_counter() - t0
    for _ in range(2):
        old = [g.group_id for g in buffer.groups()[: max(1, live_groups // 2)]]
        await buffer.drop(old)
        await commit_new(len(old))
    check(buffer.rows == live_groups * GROUP, "churn changed the number of live rows")
    live = buffer.rows * ROW_BYTES
    small = TensorDict({"y": torch.zeros(GROUP, STREAM_GROUP_BYTES // GROUP // 4)}, batch_size=GROUP)

    Snap = Callable[[Path, dict[str, Any], dict[str, Any]], Awaitable[Any]]

    def streamed_now(kind: str) -> Snap:
        async def make(directory: Path, meta: dict[str, Any], listed: dict[str, Any]) -> Any:
            client.snapshot = kind
            return await client.save_checkpoint(
                directory, meta, partition, CapturedRows(sorted(listed), buffer.field_names_by_group(), listed)
            )

        return make

    async def streamed_before(directory: Path, meta: dict[str, Any], listed: dict[str, Any]) -> Any:
        captured = CapturedRows(sorted(listed), buffer.field_names_by_group(), listed)
        return before.StreamedSnapshot.capture(tq, directory, meta, partition, captured)

    async def save(make: Snap, directory: Path, rollouts: bool = True) -> dict[str, Any]:
        """One save the way the controller cuts it, with small rollout groups committing meanwhile (``rollouts``;
        off where the save's own CPU is measured)."""
        waits_before = len(barrier.stats.mutation_waits)
        stop = asyncio.Event()
        latencies: list[float] = []
        stream_buffer = TQReplayBuffer(client, barrier, partition=partition + "s", group_size=GROUP)

        async def stream() -> None:
            i = 0
            while not stop.is_set():
                t = time.perf_counter()
                await stream_buffer.commit(f"s{uuid.uuid4().hex[:8]}", i, 0, small)
                latencies.append(time.perf_counter() - t)
                i += 1
                await asyncio.sleep(STREAM_INTERVAL_S)

        streamer = asyncio.create_task(stream() if rollouts else asyncio.sleep(0))
        await asyncio.sleep(0.05 if rollouts else 0)  # the stream is flowing before the save asks for the window
        t0 = time.perf_counter()
        async with barrier.checkpoint():
            w0 = time.perf_counter()
            meta = buffer.metadata_state_dict()
            listed = await client.list_samples(partition)
            check(set(listed) == buffer.sample_ids(), "inventory mismatch before save")
            snap = await make(directory, {"digest": meta["digest"], "step": counter}, listed)
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

    async def tq_get_all() -> float:
        """TransferQueue's own client reading every live group (no disk): half of the save's ceiling."""
        keys = [list(g.sample_ids) for g in buffer.groups()]
        t0 = time.perf_counter()
        pending: list[asyncio.Task[Any]] = []
        for k in keys:
            pending.append(asyncio.ensure_future(tq.async_kv_batch_get(keys=k, partition_id=partition)))
            if len(pending) >= IN_FLIGHT:
                got = await pending.pop(0)
        for t in pending:
            got = await t
        secs = time.perf_counter() - t0
        check(got.batch_size[0] == GROUP, "TransferQueue's get returned other rows")
        return secs

    reps = 1 if h.quick else (2 if size_mib >= 1024 else 3)
    base = h.work / f"dp{size_mib}u{units}"
    base.mkdir(parents=True, exist_ok=True)
    cands: dict[str, list[dict[str, Any]]] = {"streamed": [], "before": [], "native": []}
    raw_w: list[float] = []
    tq_get: list[float] = []
    run_native = units == 1 and size_mib <= NATIVE_MAX_MIB
    raw_path = base / "raw.bin"
    for r in range(reps):
        for name, make in (("streamed", streamed_now("streamed")), ("before", streamed_before), ("native", None)):
            if (name == "before" and before is None) or (name == "native" and not run_native):
                continue
            d = base / f"{name}{r}"
            cands[name].append(await save(make or streamed_now("native"), d))
            if r < reps - 1:
                shutil.rmtree(d)
        client.snapshot = "streamed"
        if raw_path.exists():
            raw_path.unlink()
        raw_w.append(await asyncio.to_thread(raw_write, raw_path, live))
        tq_get.append(await tq_get_all())

    meter = cpu.CpuMeter()
    meter.calibrate(0.3 if h.quick else 1.0)

    async def save_quiet() -> None:
        await save(streamed_now("streamed"), base / f"cpu_save{uuid.uuid4().hex[:6]}", rollouts=False)

    cpu_saves = await cpu.interleave(
        meter,
        reps,
        {
            "save": (None, save_quiet),
            "tq_get": (None, tq_get_all),
            "raw_write": (
                lambda: raw_path.unlink(missing_ok=True),
                lambda: asyncio.to_thread(raw_write, raw_path, live),
            ),
        },
    )
    for d in base.glob("cpu_save*"):
        shutil.rmtree(d)
    sdir = base / f"streamed{reps - 1}"
    bdir = base / f"before{reps - 1}"
    ndir = base / f"native{reps - 1}"
    check(all(s["rows"] == live_groups * GROUP for s in cands["streamed"]), "streamed snapshot row count")
    ids_on_disk = [sid for g in iter_groups(sdir) for sid in g.ids]
    check(set(ids_on_disk) == buffer.sample_ids(), "streamed snapshot != captured index")
    check(len(ids_on_disk) == len(set(ids_on_disk)), "streamed snapshot repeats a row")
    expected = {g.group_id: int(g.group_id[1:]) for g in buffer.groups()}
    # TransferQueue's own put of exactly these tensors, already in memory (copied out of the mapped files): the
    # restore ceiling's other half
    in_memory = [RestoredGroup(g.group, g.ids, g.tags, g.data.clone()) for g in iter_groups(sdir)]

    def check_restored(probe: str, what: str) -> None:
        listing = tq.kv_list(partition).get(partition, {})
        check(set(listing) == set(ids_on_disk), f"{what}: restored rows != snapshot rows")
        got = tq.kv_batch_get(keys=[f"{probe}:{i}" for i in range(GROUP)], partition_id=partition)
        want = group_fields(expected[probe])
        check(bool(torch.equal(got["reward"], want["reward"])), f"{what}: restored reward differs")
        xv = got["x"].values() if got["x"].is_nested else got["x"].reshape(-1)
        check(bool(torch.equal(xv.reshape(GROUP, -1), want["x"])), f"{what}: restored payload differs")
        check(listing[f"{probe}:0"] == {"group": probe, "version": expected[probe]}, f"{what}: restored tags differ")

    async def tq_put_all() -> float:
        t0 = time.perf_counter()
        pending: list[asyncio.Task[Any]] = []
        for g in in_memory:
            put = tq.async_kv_batch_put(keys=g.ids, partition_id=partition, fields=g.data, tags=g.tags)
            pending.append(asyncio.ensure_future(put))
            if len(pending) >= IN_FLIGHT:
                await pending.pop(0)
        for t in pending:
            await t
        return time.perf_counter() - t0

    restore: dict[str, list[float]] = {"streamed": [], "before": [], "native": [], "tq_put": [], "raw_read": []}
    for r in range(reps):
        probe = sorted(expected)[r % len(expected)]
        for name, directory in (("streamed", sdir), ("before", bdir), ("native", ndir)):
            if not directory.exists():
                continue
            h.clear_all()
            drop_cache(files_under(directory))
            t0 = time.perf_counter()
            if name == "streamed":
                await asyncio.to_thread(load_streamed, tq, directory)
            elif name == "before":
                await asyncio.to_thread(before.load_streamed, tq, directory)
            else:
                await asyncio.to_thread(tq.load_checkpoint, str(directory))
            restore[name].append(time.perf_counter() - t0)
            if name == "native":
                check(len(tq.kv_list(partition).get(partition, {})) == len(ids_on_disk), "native restore rows")
            else:
                check_restored(probe, f"{name} restore")
        h.clear_all()
        restore["tq_put"].append(await tq_put_all())
        check_restored(probe, "TransferQueue's own put")
        restore["raw_read"].append(await asyncio.to_thread(raw_read, raw_path))
    cpu_restores = await cpu.interleave(
        meter,
        reps,
        {
            "restore": (
                lambda: (h.clear_all(), drop_cache(files_under(sdir))),
                lambda: asyncio.to_thread(load_streamed, tq, sdir),
            ),
            "tq_put": (h.clear_all, tq_put_all),
            "raw_read": (None, lambda: asyncio.to_thread(raw_read, raw_path)),
        },
    )
    h.clear_all()
    shutil.rmtree(base)

    def bw(secs: list[float]) -> dict[str, float]:
        return summary([live / s / MiB for s in secs])

    def ceiling(a: list[float], b: list[float]) -> dict[str, float]:
        """Per repetition, the slower of the two halves (they were measured side by side)."""
        return summary([live / max(x, y) / MiB for x, y in zip(a, b, strict=True)])

    def collect(saves: list[dict[str, Any]]) -> dict[str, Any]:
        waits = [w for s in saves for w in s["commit_waits"]]
        lats = [x for s in saves for x in s["commit_latencies"]]
        return {
            "save_s": summary([s["seconds"] for s in saves]),
            "save_mib_s": bw([s["seconds"] for s in saves]),
            "window_ms": summary([s["window_s"] * 1e3 for s in saves]),
            "bundle_bytes": saves[-1]["bundle_bytes"],
            "bundle_over_live": saves[-1]["bundle_bytes"] / live,
            "commit_wait_ms": {"p50": percentile(waits, 50) * 1e3, "p99": percentile(waits, 99) * 1e3},
            "commit_latency_ms": {"p50": percentile(lats, 50) * 1e3, "p99": percentile(lats, 99) * 1e3},
            "commits_during_saves": len(waits),
            "streams": saves[-1]["streams"],
        }

    out: dict[str, Any] = {
        "size_mib": size_mib,
        "units": units,
        "live_bytes": live,
        "groups": live_groups,
        "fill_mib_s": live / fill_s / MiB,
        "raw_write_mib_s": bw(raw_w),
        "tq_get_mib_s": bw(tq_get),
        "save_ceiling_mib_s": ceiling(raw_w, tq_get),
        "raw_read_mib_s": bw(restore["raw_read"]),
        "tq_put_mib_s": bw(restore["tq_put"]),
        "restore_ceiling_mib_s": ceiling(restore["raw_read"], restore["tq_put"]),
        "cpu": cpu.cost_rows({**cpu_saves, **cpu_restores}, live, meter.idle_rate),
    }
    for name in ("streamed", "before", "native"):
        if not cands[name]:
            continue
        c = collect(cands[name])
        c["save_over_raw"] = c["save_mib_s"]["median"] / out["raw_write_mib_s"]["median"]
        c["save_over_ceiling"] = c["save_mib_s"]["median"] / out["save_ceiling_mib_s"]["median"]
        if restore[name]:
            c["restore_mib_s"] = bw(restore[name])
            c["restore_over_raw"] = c["restore_mib_s"]["median"] / out["raw_read_mib_s"]["median"]
            c["restore_over_ceiling"] = c["restore_mib_s"]["median"] / out["restore_ceiling_mib_s"]["median"]
        out[name] = c
    return out
