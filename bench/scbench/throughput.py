"""Section 6: data-plane calls through the product vs TransferQueue's own client, at several batch sizes.

Three candidates, the same rows per call. The product path is what the controller runs:
``TQReplayBuffer.commit_groups`` (barrier slot, index, tags: one put per batch of groups), the adapter's
``get_samples`` (dense fields) and ``TQReplayBuffer.drop`` (one clear per batch). TransferQueue's own client is
``tq.async_kv_batch_put`` / ``async_kv_batch_get`` / ``async_kv_clear`` with the same rows per call, in the same
process (so with the per-call fix of ``sc_app.data_plane.tq_fastpath``): the ceiling the adapter is held to; and
the same client as shipped ("TQ as shipped": its psutil call per put/get and its warning back in place), to show
what that fix is worth. A batch is ``groups`` groups of 8 rows; one group per call is how the rollout pump
committed before issue 12 (the "before"). Candidates run interleaved, after one warm-up round that is not kept;
``ray.put``/``ray.get`` of the same 8-row tensors are kept as the plain-Ray reference of earlier runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from bench.scbench.common import GROUP, Harness, KiB, MiB, check, summary

# (row bytes, total rows moved per measurement full/quick, groups per call)
SHAPES: tuple[tuple[int, tuple[int, int], tuple[int, ...]], ...] = (
    (KiB, (8192, 1024), (1, 4, 32)),
    (MiB, (256, 32), (1, 4)),
)


@contextlib.contextmanager
def as_shipped(on: bool) -> Iterator[None]:
    """TransferQueue's client with its own per-call thread limiter (as shipped) for the block, when ``on``."""
    import transfer_queue.client as client
    from transfer_queue.utils import common

    if not on:
        yield
        return
    mine = client.limit_pytorch_auto_parallel_threads
    client.limit_pytorch_auto_parallel_threads = common.limit_pytorch_auto_parallel_threads
    try:
        yield
    finally:
        client.limit_pytorch_auto_parallel_threads = mine


def run(h: Harness) -> list[dict[str, Any]]:
    print("[calls] product path vs TransferQueue's own client ...", flush=True)
    h.use_units(1)
    out = asyncio.run(_run(h))
    h.clear_all()
    return out


async def _run(h: Harness) -> list[dict[str, Any]]:
    client = h.client()
    reps = 1 if h.quick else 3
    out = []
    for row_bytes, totals, batch_sizes in SHAPES:
        total_rows = totals[1] if h.quick else totals[0]
        for groups in batch_sizes:
            out.append(await _shape(h, client, row_bytes, total_rows, groups, reps))
    _ray_reference(out, reps)
    _speedups(out)
    return out


async def _shape(h: Harness, client: Any, row_bytes: int, total_rows: int, groups: int, reps: int) -> dict[str, Any]:
    """One shape (row bytes, groups per call): every candidate's put, get and clear seconds, interleaved."""
    import torch
    from tensordict import TensorDict

    rows_per_call = groups * GROUP
    calls = max(2, total_rows // rows_per_call)
    data = TensorDict({"x": torch.randn(rows_per_call, row_bytes // 4)}, batch_size=rows_per_call)
    secs: dict[str, list[float]] = {
        f"{who}_{op}": [] for who in ("adapter", "tq", "shipped") for op in ("put", "get", "clear")
    }
    for rep in range(-1, reps):  # rep -1 warms every path up (first partition, sockets) and is not kept
        await _adapter_round(h, client, f"tp{row_bytes}a", rep, calls, groups, data, secs)
        for who in ("tq", "shipped"):  # TransferQueue's own client, same rows per call: in this process, as shipped
            await _tq_round(h, who, f"tp{row_bytes}{who}", rep, calls, data, secs)
        if rep < 0:
            for v in secs.values():
                v.clear()
    nrows = calls * rows_per_call
    entry: dict[str, Any] = {
        "row_bytes": row_bytes,
        "groups_per_call": groups,
        "rows_per_call": rows_per_call,
        "calls": calls,
        "rows": nrows,
    }
    for key, s in secs.items():
        entry[key] = {
            "rows_s": summary([nrows / x for x in s]),
            "mib_s": summary([nrows * row_bytes / x / MiB for x in s]),
        }
    for op in ("put", "get", "clear"):
        entry[f"{op}_shipped_over_tq"] = (
            entry[f"shipped_{op}"]["rows_s"]["median"] / entry[f"tq_{op}"]["rows_s"]["median"]
        )
        entry[f"{op}_over_tq"] = entry[f"adapter_{op}"]["rows_s"]["median"] / entry[f"tq_{op}"]["rows_s"]["median"]
    return entry


async def _adapter_round(
    h: Harness, client: Any, part: str, rep: int, calls: int, groups: int, data: Any, secs: dict[str, list[float]]
) -> None:
    """The product path: the buffer (barrier slot + index) over the adapter."""
    import torch

    from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
    from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer

    buffer = TQReplayBuffer(client, DataPlaneCheckpointBarrier(), partition=part, group_size=GROUP)
    batches = [[GroupCommit(f"r{rep}c{c}g{g}", c * groups + g, 0) for g in range(groups)] for c in range(calls)]
    t0 = time.perf_counter()
    for commits in batches:
        await buffer.commit_groups(commits, data)
    secs["adapter_put"].append(time.perf_counter() - t0)
    id_batches = [[f"{c.group_id}:{r}" for c in commits for r in range(GROUP)] for commits in batches]
    t0 = time.perf_counter()
    for ids in id_batches:
        got = await client.get_samples(part, ids)
    secs["adapter_get"].append(time.perf_counter() - t0)
    check(bool(torch.equal(got["x"], data["x"])), "adapter get returned other bytes")
    t0 = time.perf_counter()
    for commits in batches:
        await buffer.drop([c.group_id for c in commits])
    secs["adapter_clear"].append(time.perf_counter() - t0)
    check(not h.tq.kv_list(part).get(part), "rows left after the adapter's clears")


async def _tq_round(
    h: Harness, who: str, part: str, rep: int, calls: int, data: Any, secs: dict[str, list[float]]
) -> None:
    """TransferQueue's own client (``who``: "tq" in this process, "shipped" as shipped), the same rows per call."""
    import torch

    tq = h.tq
    rows_per_call = data.batch_size[0]
    tags = [{"group": "g", "version": 0}] * rows_per_call
    keys = [[f"r{rep}c{c}:{r}" for r in range(rows_per_call)] for c in range(calls)]
    with as_shipped(who == "shipped"):
        t0 = time.perf_counter()
        for k in keys:
            await tq.async_kv_batch_put(keys=k, partition_id=part, fields=data, tags=tags)
        secs[f"{who}_put"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for k in keys:
            got = await tq.async_kv_batch_get(keys=k, partition_id=part)
        secs[f"{who}_get"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for k in keys:
            await tq.async_kv_clear(keys=k, partition_id=part)
        secs[f"{who}_clear"].append(time.perf_counter() - t0)
    x = got["x"]
    check(bool(torch.equal(x.values().view_as(data["x"]) if x.is_nested else x, data["x"])), "tq get")
    check(not tq.kv_list(part).get(part), "rows left after TransferQueue's clears")


def _ray_reference(out: list[dict[str, Any]], reps: int) -> None:
    """The plain-Ray reference: ray.put / ray.get of the same 8-row tensors (one group per call shapes)."""
    import ray
    import torch

    for entry in out:
        if entry["groups_per_call"] != 1:
            continue
        row_bytes, calls = entry["row_bytes"], entry["calls"]
        x = torch.randn(GROUP, row_bytes // 4)
        put_s, get_s = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            refs = [ray.put(x) for _ in range(calls)]
            put_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for ref in refs:
                got_x = ray.get(ref)
            get_s.append(time.perf_counter() - t0)
            check(bool(torch.equal(got_x, x)), "ray.get returned other bytes")
            del refs
        entry["ray_put"] = {"rows_s": summary([entry["rows"] / s for s in put_s])}
        entry["ray_get"] = {"rows_s": summary([entry["rows"] / s for s in get_s])}


def _speedups(out: list[dict[str, Any]]) -> None:
    """Rows/s of a batch of groups per call vs one group per call (the "before"), per row size."""
    by_row: dict[int, dict[int, dict[str, Any]]] = {}
    for entry in out:
        by_row.setdefault(entry["row_bytes"], {})[entry["groups_per_call"]] = entry
    for entries in by_row.values():
        one = entries[1]
        for entry in entries.values():
            entry["put_speedup_vs_one_group"] = (
                entry["adapter_put"]["rows_s"]["median"] / one["adapter_put"]["rows_s"]["median"]
            )
