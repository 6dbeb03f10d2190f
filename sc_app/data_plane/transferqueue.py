"""TransferQueue adapter over the real ``transferqueue`` package (SimpleStorage backend).

``bootstrap=True``: may initialise TransferQueue and restore it (the trainer's client on the driver, seed flow 1).
``bootstrap=False``: connect-only (the controller's client, trainer workers); refuses to exist before the restore
decision is sealed in the shared ``DataPlaneGuard``.

Sample ids are our own string keys (TransferQueue reuses its global indexes after clears).

A client serves the TransferQueue its process was attached to when it was built: once the process detaches
(``detach_transferqueue``, a warm in-job restore), every call through it raises ``DataPlaneDetached`` — TransferQueue's
client is one per process and re-attaches to the rebuilt data plane, where the old rows' indexes and a late clear of
the old run mean something else. A read returns exactly the rows it asked for, or raises ``RowsMissing``
(TransferQueue's key lookup silently leaves out keys it does not hold).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

import torch
from tensordict import TensorDict

from sc_app import faults, waits
from sc_app.data_plane import tq_fastpath, tq_lifecycle, units
from sc_app.data_plane.client import (
    METADATA_FILE,
    CapturedRows,
    DataPlaneClient,
    DataPlaneDetached,
    DataPlaneSnapshot,
    RestoreOrderError,
    RestoreRefused,
    RowsMissing,
)
from sc_app.data_plane.guard import get_guard
from sc_app.data_plane.streamed import StreamedSnapshot, load_streamed
from sc_app.data_plane.streamed_format import is_streamed

log = logging.getLogger(__name__)
GUARD_WHAT = "the data-plane restore guard"  # a bounded wait's name for it (sc_app.waits)


def tq_conf(storage_units: int, storage_node_resource: str | None) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "backend": {
                "storage_backend": "SimpleStorage",
                "SimpleStorage": {
                    "num_data_storage_units": storage_units,
                    "required_node_resource": storage_node_resource,
                },
            }
        }
    )


def dense(td: TensorDict) -> TensorDict:
    """TransferQueue returns jagged (nested) tensors even for equal shapes; make every field dense.

    Equal-length jagged fields become a view of their values (no copy, no per-row work); only truly ragged
    fields are stacked row by row (which fails, as it should, when their shapes differ)."""
    out = {}
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        value = td.get(key)
        if isinstance(value, torch.Tensor) and value.is_nested:
            value = dense_nested(value)
        out[key] = value
    return TensorDict(out, batch_size=td.batch_size)


def dense_nested(value: torch.Tensor) -> torch.Tensor:
    """``[rows, ...]`` dense tensor of a nested tensor whose rows all have one shape."""
    if value.layout == torch.jagged and value.size(0) > 0:
        lengths = value.offsets().diff()
        if bool((lengths == lengths[0]).all()):
            values = value.values()
            return values.reshape(value.size(0), int(lengths[0]), *values.shape[1:])
    return torch.stack(list(value.unbind()))


class WrittenSnapshot(DataPlaneSnapshot):
    """A snapshot whose bytes are already on disk."""

    def __init__(self, directory: Path, rows: int, seconds: float) -> None:
        self.directory, self.rows, self.seconds = directory, rows, seconds

    async def write(self, *, executor: Executor | None = None) -> dict[str, Any]:
        size = sum(p.stat().st_size for p in self.directory.rglob("*") if p.is_file())
        return {"bytes": size, "rows": self.rows, "seconds": self.seconds}


SnapshotKind = Literal["streamed", "native"]


class TransferQueueDataPlane(DataPlaneClient):
    """``snapshot`` picks how ``save_checkpoint`` writes: ``"streamed"`` (capture in the window, write after it,
    no pickle; see ``streamed.py``) or ``"native"`` (TransferQueue's own save, all bytes inside the window).
    ``load_checkpoint`` reads either, whatever ``snapshot`` says: it dispatches on ``metadata.json``'s format."""

    def __init__(
        self,
        *,
        bootstrap: bool,
        namespace: str,
        storage_units: int = 1,
        storage_node_resource: str | None = None,
        client_id: str | None = None,
        snapshot: SnapshotKind = "streamed",
        held_cpus: Mapping[str, float] | None = None,
    ) -> None:
        import transfer_queue as tq

        tq_fastpath.install(tq)
        if snapshot not in ("streamed", "native"):
            raise ValueError(f"data_plane.snapshot must be 'streamed' or 'native', got {snapshot!r}")
        self._tq = tq
        self.snapshot: SnapshotKind = snapshot
        self.bootstrap = bootstrap
        self.client_id = client_id or f"{'bootstrap' if bootstrap else 'connect'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._touched = False
        self._attachment = _detaches  # the process's TransferQueue attachment this client serves (_live)
        self.last_restore: dict[str, Any] | None = None  # what the last streamed restore did (rows, streams)
        self._guard = get_guard(namespace, create=bootstrap)
        if bootstrap:
            # tq.init, its two actors at once; the units where the job's other actors leave CPUs (held_cpus)
            tq_lifecycle.start(tq_conf(storage_units, storage_node_resource), held=held_cpus)
        else:
            sealed = waits.get(self._guard.sealed.remote(), what=GUARD_WHAT, kind="data_plane.controller")
            if sealed is None:
                raise RestoreOrderError(
                    f"connect-only data-plane client {self.client_id} built before the restore decision was sealed; "
                    "the bootstrap client must restore (or decide on a fresh start) first"
                )
            tq.init()  # attaches to the running TransferQueue

    def _live(self) -> None:
        """``DataPlaneDetached`` once this process detached from the TransferQueue this client was built on."""
        if _detaches != self._attachment:
            raise DataPlaneDetached(
                f"{self.client_id}: this process detached from the data plane it was built on (an in-job restore)"
            )

    # -- touch bookkeeping: one Ray call per client lifetime, not per row --------------------------------
    def _report_touch(self, op: str) -> None:
        if not self._touched:
            self._touched = True
            waits.get(self._guard.touch.remote(self.client_id, op), what=GUARD_WHAT, kind="data_plane.controller")

    async def _report_touch_async(self, op: str) -> None:
        if not self._touched:
            self._touched = True
            await self._guard.touch.remote(self.client_id, op)

    # -- data ops -----------------------------------------------------------------------------------------
    async def put_samples(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: list[dict[str, Any]] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> list[int]:
        """What ``kv_batch_put`` does (look the keys up, creating them; put; set tags), keeping the indexes; with
        ``global_indexes`` (and the rows' ``tags``) the lookup is skipped. Fault points ``dp.put`` / ``dp.write``
        (``sc_app.faults``): the first half of the rows is put, then the call fails."""
        if data.batch_size[0] != len(sample_ids):
            raise ValueError(f"{len(sample_ids)} sample ids for {data.batch_size[0]} rows")
        point = "dp.put" if global_indexes is None else "dp.write"
        action = faults.take(point)
        if action is not None:
            half = len(sample_ids) // 2
            if half and action != "delay":
                gis = None if global_indexes is None else global_indexes[:half]
                await self._put(partition, sample_ids[:half], data[:half], tags and tags[:half], gis)
            if action == "delay":
                await asyncio.sleep(faults.delay_s())
            faults.act(point, action)
        return await self._put(partition, sample_ids, data, tags, global_indexes)

    async def _put(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: list[dict[str, Any]] | None,
        global_indexes: list[int] | None,
    ) -> list[int]:
        self._live()
        await self._report_touch_async("put_samples")
        client = units.tq_client(self._tq)
        if global_indexes is None:
            meta = await client.async_kv_retrieve_meta(keys=list(sample_ids), partition_id=partition, create=True)
            if meta.size != len(sample_ids):
                raise RuntimeError(f"TransferQueue found {meta.size} of {len(sample_ids)} keys in {partition!r}")
        else:
            if tags is None:
                raise ValueError("a put by global index must carry the rows' tags: TransferQueue replaces them")
            meta = units.batch_meta(partition, global_indexes)
        if tags is not None:
            meta.update_custom_meta(tags)
        await client.async_put(data, meta)
        return list(meta.global_indexes)

    async def get_samples(
        self,
        partition: str,
        sample_ids: list[str],
        field_names: list[str] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> TensorDict:
        self._live()
        await self._report_touch_async("get_samples")
        if global_indexes is not None and field_names:
            if len(global_indexes) != len(sample_ids):
                raise ValueError(f"{len(global_indexes)} global indexes for {len(sample_ids)} sample ids")
            meta = units.batch_meta(partition, global_indexes, field_names)
            rows = await units.tq_client(self._tq).async_get_data(meta)
        else:
            rows = await self._tq.async_kv_batch_get(
                keys=list(sample_ids), partition_id=partition, select_fields=field_names
            )
        return dense(_all_rows(rows, sample_ids, partition))

    def get_samples_sync(
        self, partition: str, sample_ids: list[str], field_names: list[str] | None = None
    ) -> TensorDict:
        self._live()
        self._report_touch("get_samples")
        coro = self._tq.async_kv_batch_get(keys=list(sample_ids), partition_id=partition, select_fields=field_names)
        return dense(_all_rows(_wait_detachable(coro), sample_ids, partition))

    async def clear_samples(
        self, partition: str, sample_ids: list[str], *, global_indexes: list[int] | None = None
    ) -> None:
        self._live()
        await self._report_touch_async("clear_samples")
        action = faults.take("dp.clear")  # injected: the first half of the rows is cleared, then the call fails
        if action is not None:
            half = len(sample_ids) // 2
            if half and action != "delay":
                await self._clear(partition, sample_ids[:half], global_indexes and global_indexes[:half])
            if action == "delay":
                await asyncio.sleep(faults.delay_s())
            faults.act("dp.clear", action)
        await self._clear(partition, sample_ids, global_indexes)

    async def _clear(self, partition: str, sample_ids: list[str], global_indexes: list[int] | None) -> None:
        self._live()
        if global_indexes is not None:
            await units.tq_client(self._tq).async_clear_samples(units.batch_meta(partition, global_indexes))
            return
        await self._tq.async_kv_clear(keys=list(sample_ids), partition_id=partition)

    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        self._live()
        await self._report_touch_async("list_sample_ids")
        listing = await self._tq.async_kv_list(partition_id=partition)
        return {sid: dict(tags or {}) for sid, tags in listing.get(partition, {}).items()}

    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        """``streamed``: record the rows only (bytes are copied by ``write()``, after the window).
        ``native``: TransferQueue's own snapshot, all bytes written here, inside the caller's window."""
        self._live()
        await self._report_touch_async("save_checkpoint")
        if self.snapshot == "streamed":
            return StreamedSnapshot.capture(self._tq, Path(directory), metadata, partition, captured)
        started = time.perf_counter()
        # TransferQueue's save is synchronous (its client runs its own loop); keep our loop responsive.
        await asyncio.to_thread(self._tq.save_checkpoint, str(directory), metadata=metadata)
        return WrittenSnapshot(Path(directory), len(captured.sample_ids), time.perf_counter() - started)

    # -- restore (bootstrap only) ---------------------------------------------------------------------------
    def _require_clean_for_load(self) -> None:
        if not self.bootstrap:
            raise RestoreRefused(f"{self.client_id} is connect-only; only the bootstrap client may restore")
        if self._touched:
            raise RestoreRefused(f"{self.client_id} has already read or written the data plane; restore refused")
        ok, why = waits.get(
            self._guard.begin_restore.remote(self.client_id), what=GUARD_WHAT, kind="data_plane.controller"
        )
        if not ok:
            raise RestoreRefused(f"restore refused: {why}")
        # Defence in depth: a writer that bypassed the adapter still leaves rows behind.
        listing = self._tq.kv_list()
        rows = sum(len(v) for v in listing.values())
        if rows:
            raise RestoreRefused(f"restore refused: TransferQueue already holds {rows} rows written by someone else")

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Dispatches on ``directory/metadata.json``: a streamed directory (v1 or v2) is put back one segment per put;
        anything else is TransferQueue's native format (``tq.load_checkpoint``). Refused unless untouched."""
        self._require_clean_for_load()
        self._touched = True
        if is_streamed(Path(directory)):
            doc = load_streamed(self._tq, Path(directory))
            self.last_restore = doc["restored"]
            return dict(doc.get("user_metadata", {}))
        self._tq.load_checkpoint(str(directory))
        with open(Path(directory) / METADATA_FILE) as f:
            return dict(json.load(f).get("user_metadata", {}))

    def seal(self, info: dict[str, Any]) -> None:
        waits.get(
            self._guard.seal.remote({"by": self.client_id, **info}), what=GUARD_WHAT, kind="data_plane.controller"
        )


def _all_rows(rows: TensorDict, sample_ids: list[str], partition: str) -> TensorDict:
    """``rows`` when it holds one row per asked id, else ``RowsMissing`` (never a shorter batch)."""
    got = int(rows.batch_size[0]) if rows.batch_size else 0
    if got != len(sample_ids):
        raise RowsMissing(
            f"a read of {len(sample_ids)} rows of partition {partition!r} found {got} "
            f"(asked {sample_ids[0]!r}..{sample_ids[-1]!r}); the rest are not stored"
        )
    return rows


def shutdown_transferqueue() -> None:
    """Close TransferQueue from the process that initialised it (``tq_lifecycle.stop``)."""
    tq_lifecycle.stop()


_detaches = 0  # how many times this process detached: a blocking read started before the latest one gives up
POLL_S = 0.5


def _wait_detachable(coro: Any) -> Any:
    """``coro`` on TransferQueue's client loop, waited for in slices: a read blocked on a dead storage unit or
    controller (TransferQueue's own wait has no timeout) ends with ``DataPlaneDetached`` once this process detaches,
    so the worker can be reset in place."""
    from transfer_queue import interface

    started = _detaches
    future = asyncio.run_coroutine_threadsafe(coro, interface._maybe_create_tq_client()._loop)
    while True:
        try:
            return future.result(timeout=POLL_S)
        except TimeoutError:
            if _detaches != started:
                future.cancel()
                raise DataPlaneDetached("the data plane was detached while this read waited") from None


def detach_transferqueue() -> None:
    """Forget this process's attachment to TransferQueue (its client and the controller handle) without stopping
    anything: ``tq.close()`` in a process that only attached would kill the (new) controller. The next client built
    here attaches to whatever TransferQueue runs then (a warm in-job restore rebuilt it)."""
    from transfer_queue import interface

    global _detaches
    _detaches += 1
    client, interface._TQ_CLIENT, interface._TQ_CONTROLLER = interface._TQ_CLIENT, None, None
    if client is not None:  # closed off this thread: its loop thread may take seconds to stop (its peers are gone)
        threading.Thread(target=_close_quietly, args=(client,), name="tq-detach", daemon=True).start()


def _close_quietly(client: Any) -> None:
    try:
        client.close()
    except Exception:  # its sockets point at actors that may be dead
        log.debug("closing the old TransferQueue client failed", exc_info=True)


def clear_all_rows() -> int:
    """Remove every row of every partition through this process's client (the one that initialised TransferQueue):
    a warm in-job restore keeps a live data plane and refills it from the bundle. Returns the rows removed."""
    import transfer_queue as tq

    removed = 0
    for partition, keys in tq.kv_list().items():
        if keys:
            tq.kv_clear(keys=list(keys), partition_id=partition)
            removed += len(keys)
    return removed
