"""Which TransferQueue storage unit holds which row, and on which Ray node each unit lives.

The one module that knows TransferQueue's SimpleStorage internals (pinned ``transferqueue==0.1.11``): a row with
global index ``gi`` lives on unit ``gi % n`` in the storage manager's unit order (``_group_by_hash``), and unit
``k`` is the named actor ``TransferQueueStorageUnit#k``. The streamed snapshot uses this to read and write each
unit's rows in a stream of its own; data correctness never depends on it — every read and write still goes
through TransferQueue's own routing — only how the work is split and where it runs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import Any

import ray
import torch

from sc_app import waits

log = logging.getLogger(__name__)

UNIT_ACTOR = "TransferQueueStorageUnit#{}"


@dataclass(frozen=True)
class UnitRows:
    """The rows of one storage unit, as positions into the list that was located (ascending) and their global
    indexes (same order)."""

    unit: str
    positions: list[int]
    global_indexes: list[int]


def tq_client(tq: Any) -> Any:
    """TransferQueue's own low-level client of this process (``tq_lifecycle.start`` or ``tq.init`` ran here)."""
    return tq.get_client()


def unit_ids(client: Any) -> list[str]:
    """Storage unit ids in TransferQueue's routing order."""
    return list(client.storage_manager.storage_unit_infos)


def route(client: Any, global_indexes: list[int]) -> list[UnitRows]:
    """Split rows by the unit TransferQueue routes them to (its own routing function), in unit order."""
    routing = client.storage_manager._group_by_hash(global_indexes)
    out = []
    for unit in unit_ids(client):
        group = routing.get(unit)
        if group is not None:
            out.append(UnitRows(unit, list(group.batch_positions), list(group.global_indexes)))
    return out


async def get_rows(client: Any, global_indexes: list[int], fields: list[str]) -> dict[str, list[Any]]:
    """``fields`` of the rows at ``global_indexes`` as each storage unit's reply decoded them: field → one value per
    row, in the order given — TransferQueue's own ``get_data`` without its last step, packing the rows of a field
    into one new tensor (a copy of every byte the snapshot then only writes out). Same routing and requests."""
    sm = client.storage_manager
    routing = sm._group_by_hash(global_indexes)
    replies = await asyncio.gather(
        *(
            sm._request_with_retry(
                "get",
                unit,
                f"samples={len(group.global_indexes)} fields={fields}",
                functools.partial(
                    sm._get_from_single_storage_unit, group.global_indexes, fields, target_storage_unit=unit
                ),
            )
            for unit, group in routing.items()
        )
    )
    out: dict[str, list[Any]] = {f: [None] * len(global_indexes) for f in fields}
    for group, (got_fields, data) in zip(routing.values(), replies, strict=True):
        for f in got_fields:
            column = out[f]
            for value, pos in zip(data[f], group.batch_positions, strict=True):
                column[pos] = value
    return out


async def locate(client: Any, partition: str, keys: list[str]) -> list[int]:
    """Global indexes of ``keys`` (one controller call). ``KeyError`` names a key that is not stored."""
    meta = await client.async_kv_retrieve_meta(keys=keys, partition_id=partition, create=False)
    if meta.size != len(keys):
        raise KeyError(f"{len(keys) - meta.size} of {len(keys)} rows are not in partition {partition!r}")
    return list(meta.global_indexes)


async def register(client: Any, partition: str, keys: list[str]) -> list[int]:
    """Register ``keys`` (one controller call, no data) and return their global indexes in the order given."""
    meta = await client.async_kv_retrieve_meta(keys=keys, partition_id=partition, create=True)
    if meta.size != len(keys):
        raise RuntimeError(f"TransferQueue registered {meta.size} of {len(keys)} keys in {partition!r}")
    return list(meta.global_indexes)


def batch_meta(partition: str, global_indexes: list[int], fields: list[str] | None = None) -> Any:
    """A ``BatchMeta`` for these rows (what TransferQueue's own get/put need: indexes, partition, field names) —
    built here instead of asking the controller again for rows whose indexes are known."""
    from transfer_queue.metadata import BatchMeta

    schema = {name: {} for name in fields or ()}
    n = len(global_indexes)
    return BatchMeta(global_indexes=global_indexes, partition_ids=[partition] * n, field_schema=schema)


def segments_of(group_sizes: list[int], positions: list[int]) -> list[tuple[int, int, int]]:
    """``(group number, start, count)`` runs of ``positions`` (ascending positions into rows laid out group after
    group with ``group_sizes`` rows each): which rows of which group one unit holds. Vectorised, no per-row loop."""
    if not positions:
        return []
    ends = torch.tensor(group_sizes, dtype=torch.int64).cumsum(0)
    pos = torch.tensor(positions, dtype=torch.int64)
    group_of = torch.searchsorted(ends, pos, right=True)
    groups, counts = torch.unique_consecutive(group_of, return_counts=True)
    starts = counts.cumsum(0) - counts
    return list(zip(groups.tolist(), starts.tolist(), counts.tolist(), strict=True))


_nodes: dict[tuple[str, ...], dict[str, str]] = {}  # unit ids -> their nodes (units never move while they live)


def unit_nodes(client: Any) -> dict[str, str]:
    """Node id of each storage unit, by unit id (empty when unknown); looked up once per TransferQueue."""
    key = tuple(unit_ids(client))
    if key not in _nodes:
        _nodes[key] = _lookup_nodes(client)
    return _nodes[key]


def _lookup_nodes(client: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        import ray._private.state as ray_state

        for k, unit in enumerate(unit_ids(client)):
            handle = ray.get_actor(UNIT_ACTOR.format(k))
            info = waits.get(
                handle.get_zmq_server_info.remote(), what=UNIT_ACTOR.format(k), bound=waits.current().capped(30)
            )
            if info.id != unit:  # the routing order is not the creation order: place nothing
                return {}
            entry = ray_state.actors(handle._actor_id.hex())
            out[unit] = entry["Address"]["NodeID"]
    except Exception as exc:  # placement is an optimisation: without it every stream runs here
        log.info("storage unit nodes unknown (%s); snapshot streams run in this process", exc)
        return {}
    return out
