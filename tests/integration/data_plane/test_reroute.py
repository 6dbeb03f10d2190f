"""A streamed snapshot restores into another storage-unit count (real Ray, real TransferQueue, real units).

A job that lost a node must be able to come back with fewer storage units, and one given more must use them. Each
case commits groups (batched commits, an advantage write, several dtypes and row shapes) into a TransferQueue of
``src`` units, cuts a snapshot exactly as the controller does (index → capture → freeze → write → thaw), closes that
TransferQueue, bootstraps one with ``dst`` units and restores into it. Then:
* every row is back bit for bit, with its tags, under its sample id;
* the replay index rebuilt from the sidecar passes the inventory check (index == stored rows) and its digest is
  the one the snapshot recorded;
* the rows are spread over the ``dst`` units TransferQueue routes them to (all of them for 1 → 2), and the source
  snapshot really had ``src`` streams (so 2 → 1 merges two streams into one unit);
* a snapshot cut after the restore holds the same rows again (the restored data plane is a normal one).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402

from sc_app.data_plane import units  # noqa: E402
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier  # noqa: E402
from sc_app.data_plane.client import CapturedRows  # noqa: E402
from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer  # noqa: E402
from sc_app.data_plane.streamed_format import read_metadata  # noqa: E402
from sc_app.data_plane.transferqueue import TransferQueueDataPlane  # noqa: E402
from tests.support.tq import close_transferqueue  # noqa: E402

G = 4
PARTITION = "train"
GROUPS = 10


@pytest.fixture(scope="module", autouse=True)
def _own_transferqueue(local_ray: Any) -> Any:
    """This module bootstraps TransferQueues of its own unit counts; it closes the last one when done."""
    yield
    close_transferqueue()


def _rows(seed: int, n_groups: int) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    n = G * n_groups
    width = 6 + seed % 5  # groups committed in different calls have different row shapes
    return TensorDict(
        {
            "tokens": torch.randint(0, 50_000, (n, width), generator=gen),
            "logprobs": torch.randn(n, width, generator=gen),
            "reward": torch.rand(n, generator=gen).to(torch.float64),
            "hidden": torch.randn(n, 2, 8, generator=gen).to(torch.bfloat16),
            "mask": torch.rand(n, width, generator=gen) > 0.5,
        },
        batch_size=n,
    )


def _bits(t: torch.Tensor) -> tuple[str, tuple[int, ...], bytes]:
    raw = t.contiguous().reshape(-1).view(torch.uint8)  # 1-d first: a 0-d tensor has no byte view
    return str(t.dtype), tuple(t.shape), raw.numpy().tobytes()


def _bootstrap(n_units: int) -> TransferQueueDataPlane:
    close_transferqueue()
    client = TransferQueueDataPlane(bootstrap=True, namespace=f"reroute-{uuid.uuid4().hex[:8]}", storage_units=n_units)
    assert len(units.unit_ids(units.tq_client(tq))) == n_units
    return client


async def _fill(buffer: TQReplayBuffer) -> None:
    """Batched commits of 1..3 groups, then an advantage write onto some groups (a field added after the put)."""
    k, seed = 0, 0
    while k < GROUPS:
        n = min(1 + seed % 3, GROUPS - k)
        commits = [GroupCommit(f"g{k + i}", k + i, seed) for i in range(n)]
        await buffer.commit_groups(commits, _rows(seed, n))
        k, seed = k + n, seed + 1
    adv = TensorDict({"advantage": torch.linspace(-1, 1, 2 * G)}, [2 * G])
    await buffer.write_fields(["g1", "g7"], adv)


async def _snapshot(client: TransferQueueDataPlane, buffer: TQReplayBuffer, directory: Path) -> dict[str, Any]:
    """The controller's cut: index and listing in the window, capture, freeze; write after it; thaw."""
    async with buffer.barrier.checkpoint():
        sd = buffer.metadata_state_dict()
        listed = await client.list_samples(PARTITION)
        assert set(listed) == buffer.sample_ids()
        snap = await client.save_checkpoint(
            directory,
            {"digest": sd["digest"], "step": 1},
            PARTITION,
            CapturedRows(sorted(listed), field_names=buffer.field_names_by_group(), tags=listed),
        )
        buffer.freeze(listed)
    await snap.write()
    await buffer.thaw()
    return sd


async def _contents(client: TransferQueueDataPlane, buffer: TQReplayBuffer) -> dict[str, Any]:
    """Every stored row: its tags and, per field, dtype, shape and raw bytes."""
    listed = await client.list_samples(PARTITION)
    out: dict[str, Any] = {}
    for group in buffer.groups():
        ids = list(group.sample_ids)
        td = await client.get_samples(PARTITION, ids)
        for r, sid in enumerate(ids):
            out[sid] = {"tags": listed[sid], **{str(k): _bits(td[k][r]) for k in td.keys()}}  # noqa: SIM118
    return out


def _unit_counts(client: TransferQueueDataPlane, ids: list[str]) -> dict[str, int]:
    tqc = units.tq_client(tq)
    gis = asyncio.run(units.locate(tqc, PARTITION, ids))
    return {u.unit: len(u.positions) for u in units.route(tqc, gis)}


@pytest.mark.parametrize(("src", "dst"), [(2, 1), (1, 2)])
def test_restore_into_another_unit_count_is_bit_identical(src: int, dst: int, tmp_path: Path) -> None:
    client = _bootstrap(src)
    buffer = TQReplayBuffer(client, DataPlaneCheckpointBarrier(), partition=PARTITION, group_size=G)

    async def cut() -> tuple[dict[str, Any], dict[str, Any]]:
        await _fill(buffer)
        sd = await _snapshot(client, buffer, tmp_path / "src")
        return sd, await _contents(client, buffer)

    sidecar, before = asyncio.run(cut())
    assert len(before) == GROUPS * G
    assert "advantage" in before["g1:0"] and "advantage" not in before["g0:0"]
    doc = read_metadata(tmp_path / "src")
    assert len(doc["streams"]) == src and doc["rows"] == GROUPS * G
    assert len(_unit_counts(client, sorted(before))) == src

    client = _bootstrap(dst)  # the old TransferQueue (and every row in it) is gone
    meta = client.load_checkpoint(tmp_path / "src")
    assert meta["digest"] == sidecar["digest"]
    restored = TQReplayBuffer(client, DataPlaneCheckpointBarrier(), partition=PARTITION, group_size=G)
    restored.load_state_dict(sidecar, expected_digest=meta["digest"])
    assert restored.metadata_state_dict()["digest"] == sidecar["digest"]

    async def after() -> tuple[set[str], dict[str, Any], dict[str, Any]]:
        stored = await client.list_sample_ids(PARTITION)
        rows = await _contents(client, restored)
        await _snapshot(client, restored, tmp_path / "again")
        return stored, rows, await _contents(client, restored)

    stored, rows, rows_after_resave = asyncio.run(after())
    assert stored == restored.sample_ids(), "inventory check: the index must list exactly the stored rows"
    assert rows.keys() == before.keys()
    for sid, want in before.items():
        assert rows[sid] == want, f"row {sid} differs after {src} -> {dst} units"
    assert rows_after_resave == rows
    spread = _unit_counts(client, sorted(stored))
    assert len(spread) == dst and sum(spread.values()) == GROUPS * G, spread
    again = read_metadata(tmp_path / "again")
    assert again["rows"] == GROUPS * G and len(again["streams"]) == dst
