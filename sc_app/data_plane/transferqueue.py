"""TransferQueue adapter over the real ``transferqueue`` package (SimpleStorage backend).

``bootstrap=True``: may initialise TransferQueue and restore it (the trainer's client on the driver, seed flow 1).
``bootstrap=False``: connect-only (the controller's client, trainer workers); refuses to exist before the restore
decision is sealed in the shared ``DataPlaneGuard``.

Sample ids are our own string keys (TransferQueue reuses its global indexes after clears).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

import ray
import torch
from tensordict import TensorDict

from sc_app.data_plane.client import (
    METADATA_FILE,
    CapturedRows,
    DataPlaneClient,
    DataPlaneSnapshot,
    RestoreOrderError,
    RestoreRefused,
)
from sc_app.data_plane.guard import get_guard
from sc_app.data_plane.streamed import StreamedSnapshot, load_streamed
from sc_app.data_plane.streamed_format import is_streamed

log = logging.getLogger(__name__)


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
    """TransferQueue returns jagged (nested) tensors even for equal shapes; make every field dense."""
    out = {}
    for key in td.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        value = td.get(key)
        if isinstance(value, torch.Tensor) and value.is_nested:
            value = torch.stack(list(value.unbind()))
        out[key] = value
    return TensorDict(out, batch_size=td.batch_size)


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
    ) -> None:
        import transfer_queue as tq

        if snapshot not in ("streamed", "native"):
            raise ValueError(f"data_plane.snapshot must be 'streamed' or 'native', got {snapshot!r}")
        self._tq = tq
        self.snapshot: SnapshotKind = snapshot
        self.bootstrap = bootstrap
        self.client_id = client_id or f"{'bootstrap' if bootstrap else 'connect'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._touched = False
        self._guard = get_guard(namespace, create=bootstrap)
        if bootstrap:
            tq.init(tq_conf(storage_units, storage_node_resource))
        else:
            sealed = ray.get(self._guard.sealed.remote())
            if sealed is None:
                raise RestoreOrderError(
                    f"connect-only data-plane client {self.client_id} built before the restore decision was sealed; "
                    "the bootstrap client must restore (or decide on a fresh start) first"
                )
            tq.init()  # attaches to the running TransferQueue

    # -- touch bookkeeping: one Ray call per client lifetime, not per row --------------------------------
    def _report_touch(self, op: str) -> None:
        if not self._touched:
            self._touched = True
            ray.get(self._guard.touch.remote(self.client_id, op))

    async def _report_touch_async(self, op: str) -> None:
        if not self._touched:
            self._touched = True
            await self._guard.touch.remote(self.client_id, op)

    # -- data ops -----------------------------------------------------------------------------------------
    async def put_samples(
        self, partition: str, sample_ids: list[str], data: TensorDict, tags: list[dict[str, Any]] | None = None
    ) -> None:
        await self._report_touch_async("put_samples")
        await self._tq.async_kv_batch_put(keys=list(sample_ids), partition_id=partition, fields=data, tags=tags)

    async def get_samples(
        self, partition: str, sample_ids: list[str], field_names: list[str] | None = None
    ) -> TensorDict:
        await self._report_touch_async("get_samples")
        rows = await self._tq.async_kv_batch_get(
            keys=list(sample_ids), partition_id=partition, select_fields=field_names
        )
        return dense(rows)

    def get_samples_sync(
        self, partition: str, sample_ids: list[str], field_names: list[str] | None = None
    ) -> TensorDict:
        self._report_touch("get_samples")
        return dense(self._tq.kv_batch_get(keys=list(sample_ids), partition_id=partition, select_fields=field_names))

    async def clear_samples(self, partition: str, sample_ids: list[str]) -> None:
        await self._report_touch_async("clear_samples")
        await self._tq.async_kv_clear(keys=list(sample_ids), partition_id=partition)

    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        await self._report_touch_async("list_sample_ids")
        listing = await self._tq.async_kv_list(partition_id=partition)
        return {sid: dict(tags or {}) for sid, tags in listing.get(partition, {}).items()}

    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        """``streamed``: record the rows only (bytes are copied by ``write()``, after the window).
        ``native``: TransferQueue's own snapshot, all bytes written here, inside the caller's window."""
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
        ok, why = ray.get(self._guard.begin_restore.remote(self.client_id))
        if not ok:
            raise RestoreRefused(f"restore refused: {why}")
        # Defence in depth: a writer that bypassed the adapter still leaves rows behind.
        listing = self._tq.kv_list()
        rows = sum(len(v) for v in listing.values())
        if rows:
            raise RestoreRefused(f"restore refused: TransferQueue already holds {rows} rows written by someone else")

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        """Dispatches on ``directory/metadata.json``: ``sc-app/streamed-v1`` is put back one group per put;
        anything else is TransferQueue's native format (``tq.load_checkpoint``). Refused unless untouched."""
        self._require_clean_for_load()
        self._touched = True
        if is_streamed(Path(directory)):
            return dict(load_streamed(self._tq, Path(directory)).get("user_metadata", {}))
        self._tq.load_checkpoint(str(directory))
        with open(Path(directory) / METADATA_FILE) as f:
            return dict(json.load(f).get("user_metadata", {}))

    def seal(self, info: dict[str, Any]) -> None:
        ray.get(self._guard.seal.remote({"by": self.client_id, **info}))


def shutdown_transferqueue() -> None:
    """Close TransferQueue from the process that initialised it."""
    import transfer_queue as tq

    try:
        tq.close()
    except Exception:  # best effort at shutdown
        log.debug("tq.close failed", exc_info=True)
