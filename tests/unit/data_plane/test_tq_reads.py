"""The TransferQueue adapter's two refusals that keep an old data plane's rows out of a rebuilt one (pure: no Ray
call, no TransferQueue started): a read that found fewer rows than it asked for raises ``RowsMissing`` instead of
returning a shorter batch, and a client built before its process detached (a warm in-job restore) refuses every
call with ``DataPlaneDetached``."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tensordict import TensorDict

from sc_app.data_plane import transferqueue
from sc_app.data_plane.client import DataPlaneDetached, RowsMissing
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, _all_rows


def test_a_read_that_found_fewer_rows_than_asked_raises() -> None:
    """TransferQueue's key lookup leaves out keys it does not hold: 32 rows back for 64 ids (seen after a storage
    unit's warm restore) must not reach the advantage stage or a trainer as a shorter batch."""
    ids = [f"p{g}:{r}" for g in range(8) for r in range(8)]
    full = TensorDict({"reward": torch.zeros(64)}, batch_size=64)
    assert _all_rows(full, ids, "train") is full
    with pytest.raises(RowsMissing, match="a read of 64 rows of partition 'train' found 32"):
        _all_rows(full[:32], ids, "train")


def test_a_client_of_a_detached_attachment_refuses_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    client = TransferQueueDataPlane.__new__(TransferQueueDataPlane)  # no TransferQueue: the check comes first
    client.client_id, client._attachment = "connect-1", transferqueue._detaches
    client._live()  # attached: admitted
    monkeypatch.setattr(transferqueue, "_detaches", transferqueue._detaches + 1)  # detach_transferqueue()
    ids, data = ["p0:0"], TensorDict({"reward": torch.zeros(1)}, batch_size=1)
    calls = [
        client.put_samples("train", ids, data),
        client.get_samples("train", ids, ["reward"]),
        client.clear_samples("train", ids, global_indexes=[0]),
        client.list_samples("train"),
    ]
    for call in calls:
        with pytest.raises(DataPlaneDetached, match="connect-1: this process detached"):
            asyncio.run(call)
    with pytest.raises(DataPlaneDetached):
        client.get_samples_sync("train", ids, ["reward"])
