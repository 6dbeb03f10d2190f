"""Batched commits and drops racing checkpoints, against real Ray + real TransferQueue (2 storage units).

Randomized: several committers put batches of 1-6 groups (one put per batch, shapes varying between batches, some
with a jagged field), a dropper clears random batches of groups, an advantage writer adds a field to random groups,
and a saver cuts snapshots the way ``SingleControllerActor`` does (window: index, ``list_samples() == index``,
capture, freeze; then ``write()`` while everything else goes on; then ``thaw()``). Every bundle must equal exactly
the state its window captured: the same groups, ids, tags and field names, and every byte of every field — which
fails if a checkpoint ever sees half a batch, a row dropped or added after its window, or a field written after it.
The last bundle is then restored onto an emptied data plane and read back row for row.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402

from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier  # noqa: E402
from sc_app.data_plane.client import CapturedRows  # noqa: E402
from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer  # noqa: E402
from sc_app.data_plane.streamed_format import iter_groups, read_metadata  # noqa: E402
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, tq_conf  # noqa: E402
from tests.support.tq import close_transferqueue  # noqa: E402

pytestmark = pytest.mark.slow

G = 4
PARTITION = "train"
UNITS = 2
SAVES = 8
SEED = int(os.environ.get("SC_APP_TEST_SEED", "12"))  # another seed: another interleaving (the suite runs this one)


@pytest.fixture(scope="module")
def two_unit_tq(local_ray: Any) -> Any:
    close_transferqueue()
    tq.init(tq_conf(UNITS, None))
    yield tq
    close_transferqueue()


def _clear_everything() -> None:
    for part, rows in tq.kv_list().items():
        if rows:
            tq.kv_clear(keys=list(rows), partition_id=part)


# ------------------------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Shape:
    """What a batch's rows hold; every value is a function of (group, row), so the expected bytes are known."""

    tokens: int  # tokens per row
    jagged: bool  # a "resp" field whose rows have different lengths


def _group_seed(gid: str) -> int:
    return int(gid[1:])


def group_fields(gid: str, shape: Shape) -> dict[str, torch.Tensor | list[torch.Tensor]]:
    s = _group_seed(gid)
    base = torch.arange(G * shape.tokens, dtype=torch.int64).view(G, shape.tokens)
    out: dict[str, Any] = {
        "tokens": base + 1000 * s,
        "logprobs": (base.float() / 7 - s).to(torch.float32),
        "reward": torch.arange(G, dtype=torch.float32) + s,
    }
    if shape.jagged:
        out["resp"] = [torch.full((1 + (s + r) % 5,), s * 10 + r, dtype=torch.int32) for r in range(G)]
    return out


def advantage(gid: str) -> torch.Tensor:
    return torch.arange(G, dtype=torch.float32) * -0.5 + _group_seed(gid)


def batch_data(gids: list[str], shape: Shape) -> TensorDict:
    parts = [group_fields(gid, shape) for gid in gids]
    data: dict[str, Any] = {k: torch.cat([p[k] for p in parts]) for k in ("tokens", "logprobs", "reward")}
    if shape.jagged:
        rows = [r for p in parts for r in p["resp"]]
        data["resp"] = torch.nested.nested_tensor(rows, layout=torch.jagged)
    return TensorDict(data, batch_size=G * len(gids))


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def check_bundle(directory: Path, captured: dict[str, Any], shapes: dict[str, Shape]) -> None:
    """The bundle holds exactly the captured groups, rows, tags, fields and bytes."""
    doc = read_metadata(directory)
    assert len(doc["streams"]) == UNITS, "one stream of part files per storage unit"
    groups = list(iter_groups(directory, doc))
    by_group: dict[str, list[Any]] = {}
    for g in groups:
        by_group.setdefault(g.group, []).append(g)
    assert set(by_group) == set(captured["index"]), "bundle groups != the groups its window captured"
    assert doc["rows"] == G * len(captured["index"])
    for gid, segments in by_group.items():
        ids = [sid for seg in segments for sid in seg.ids]
        assert sorted(ids) == [f"{gid}:{r}" for r in range(G)], gid
        version = captured["index"][gid]["version"]
        for seg in segments:
            assert all(tag == {"group": gid, "version": version} for tag in seg.tags), gid
            assert set(seg.data.keys()) == set(captured["fields"][gid]), f"{gid}: fields differ from the capture"
            want = group_fields(gid, shapes[gid])
            rows = [int(sid.rsplit(":", 1)[1]) for sid in seg.ids]
            for key in seg.data.keys():  # noqa: SIM118
                got = seg.data[key]
                if key == "advantage":
                    expected = advantage(gid)[rows]
                elif key == "resp":
                    got = list(got.unbind()) if got.is_nested else list(got)
                    assert [_bits(x) for x in got] == [_bits(want["resp"][r]) for r in rows], gid
                    continue
                else:
                    expected = want[key][rows]  # type: ignore[index]
                assert got.dtype == expected.dtype and tuple(got.shape) == tuple(expected.shape), (gid, key)
                assert _bits(got) == _bits(expected), f"{gid}.{key}: bytes differ from the captured state"


# ------------------------------------------------------------------------------------------------ the scenario
def test_batched_commits_and_drops_against_concurrent_checkpoints(two_unit_tq: Any, tmp_path: Path) -> None:
    _clear_everything()
    client = TransferQueueDataPlane(bootstrap=True, namespace=f"t-{uuid.uuid4().hex[:8]}")
    rng = random.Random(SEED)
    bundles: list[tuple[Path, dict[str, Any]]] = []
    shapes: dict[str, Shape] = {}
    batches: list[frozenset[str]] = []

    async def scenario() -> None:
        barrier = DataPlaneCheckpointBarrier()
        buffer = TQReplayBuffer(client, barrier, partition=PARTITION, group_size=G)
        counter = iter(range(10**9))
        stop = asyncio.Event()
        advantaged: set[str] = set()
        dropping: set[str] = set()  # every group a drop was started for (recorded before the drop awaits)

        async def committer(seed: int) -> None:
            r = random.Random(seed)
            while not stop.is_set():
                gids = [f"g{next(counter)}" for _ in range(r.randint(1, 6))]
                shape = Shape(tokens=r.choice([3, 8, 33]), jagged=r.random() < 0.4)
                for gid in gids:
                    shapes[gid] = shape
                commits = [GroupCommit(gid, _group_seed(gid), _group_seed(gid) % 7) for gid in gids]
                batches.append(frozenset(gids))
                await buffer.commit_groups(commits, batch_data(gids, shape))
                await asyncio.sleep(r.random() * 0.004)

        async def dropper() -> None:
            r = random.Random(SEED + 99)
            while not stop.is_set():
                held = [g.group_id for g in buffer.groups()]
                if len(held) > 12:
                    pick = r.sample(held, r.randint(1, min(8, len(held) - 4)))
                    dropping.update(pick)
                    await buffer.drop(pick)
                await asyncio.sleep(r.random() * 0.005)

        async def advantage_writer() -> None:
            r = random.Random(SEED + 7)
            while not stop.is_set():
                fresh = [g.group_id for g in buffer.groups() if g.group_id not in advantaged]
                if fresh:
                    pick = r.sample(fresh, min(len(fresh), r.randint(1, 3)))
                    advantaged.update(pick)  # before the await: nobody picks them again
                    td = TensorDict({"advantage": torch.cat([advantage(gid) for gid in pick])}, [G * len(pick)])
                    with contextlib.suppress(KeyError):  # a group was dropped meanwhile: the write is skipped
                        await buffer.write_fields(pick, td)
                await asyncio.sleep(r.random() * 0.004)

        workers = [asyncio.create_task(committer(SEED * 10 + s)) for s in (1, 2, 3)]
        workers += [asyncio.create_task(dropper()), asyncio.create_task(advantage_writer())]
        try:
            for n in range(SAVES):
                await asyncio.sleep(rng.random() * 0.05)
                directory = tmp_path / f"step_{n}"
                async with barrier.checkpoint():
                    index = buffer.metadata_state_dict()
                    listed = await client.list_samples(PARTITION)
                    assert set(listed) == buffer.sample_ids(), "window: stored rows != index (half a batch?)"
                    fields = buffer.field_names_by_group()
                    snapshot = await client.save_checkpoint(
                        directory,
                        {"digest": index["digest"]},
                        PARTITION,
                        CapturedRows(sorted(listed), field_names=fields, tags=listed),
                    )
                    buffer.freeze(set(listed))
                    dropped_by_now = set(dropping)
                captured = {"index": index["groups"], "fields": fields}
                for b in batches:  # a batch is in a window whole, or not at all (less only what drops took)
                    present = b & set(index["groups"])
                    assert not present or b - present <= dropped_by_now, f"window {n} saw half of batch {sorted(b)}"
                try:
                    await snapshot.write()
                finally:
                    await buffer.thaw()
                bundles.append((directory, captured))
        finally:
            stop.set()
            await asyncio.gather(*workers)

    asyncio.run(scenario())
    assert len(bundles) == SAVES
    sizes = [len(c["index"]) for _, c in bundles]
    assert all(s > 0 for s in sizes) and len(set(sizes)) > 1, f"the scenario did not churn: {sizes}"
    for directory, captured in bundles:
        check_bundle(directory, captured, shapes)

    # the newest bundle restores onto an emptied data plane, every row and tag back
    directory, captured = bundles[-1]
    _clear_everything()
    restorer = TransferQueueDataPlane(bootstrap=True, namespace=f"t-{uuid.uuid4().hex[:8]}")
    restorer.load_checkpoint(directory)
    listing = tq.kv_list(PARTITION)[PARTITION]
    assert set(listing) == {f"{gid}:{r}" for gid in captured["index"] for r in range(G)}
    for gid in captured["index"]:
        ids = [f"{gid}:{r}" for r in range(G)]
        assert all(listing[sid] == {"group": gid, "version": captured["index"][gid]["version"]} for sid in ids)
        got = tq.kv_batch_get(keys=ids, partition_id=PARTITION, select_fields=["tokens"])["tokens"]
        want = group_fields(gid, shapes[gid])["tokens"]
        got = got.values().view(G, -1) if got.is_nested else got
        assert _bits(got) == _bits(want), gid
    _clear_everything()
