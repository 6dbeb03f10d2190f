"""replay_buffer.TQReplayBuffer: pure logic, against an in-memory fake data-plane client."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from sc_app.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneSnapshot
from sc_app.digest import canonical_bytes, sidecar_digest
from sc_app.replay_buffer import SIDECAR_SCHEMA_VERSION, SidecarError, TQReplayBuffer

G = 4
PARTITION = "train"


# ------------------------------------------------------------------------------------------------ fake data plane
class FakeDataPlane(DataPlaneClient):
    """In-memory client; records every call and whether a barrier slot was held during each write."""

    def __init__(self, barrier: DataPlaneCheckpointBarrier | None = None) -> None:
        self.bootstrap = False
        self.rows: dict[str, dict[str, torch.Tensor]] = {}
        self.calls: list[str] = []
        self.slots_during_writes: list[int] = []
        self.barrier = barrier

    def _write(self, op: str) -> None:
        self.calls.append(op)
        if self.barrier is not None:
            self.slots_during_writes.append(self.barrier.active_mutations)

    async def put_samples(
        self, partition: str, sample_ids: list[str], data: TensorDict, tags: list[dict[str, Any]] | None = None
    ) -> None:
        self._write("put_samples")
        await asyncio.sleep(0)
        for i, sid in enumerate(sample_ids):
            self.rows.setdefault(sid, {}).update({k: data.get(k)[i] for k in data.keys()})  # noqa: SIM118

    async def get_samples(
        self, partition: str, sample_ids: list[str], field_names: list[str] | None = None
    ) -> TensorDict:
        self.calls.append("get_samples")
        keys = field_names or list(self.rows[sample_ids[0]])
        return TensorDict({k: torch.stack([self.rows[s][k] for s in sample_ids]) for k in keys}, [len(sample_ids)])

    async def clear_samples(self, partition: str, sample_ids: list[str]) -> None:
        self._write("clear_samples")
        await asyncio.sleep(0)
        for sid in sample_ids:
            del self.rows[sid]

    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        self.calls.append("list_sample_ids")
        return {sid: {} for sid in self.rows}

    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        raise NotImplementedError

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        raise NotImplementedError

    def seal(self, info: dict[str, Any]) -> None:
        self.calls.append("seal")


def rows(n: int = G, value: float = 0.0) -> TensorDict:
    return TensorDict({"reward": torch.full((n,), value), "tokens": torch.zeros(n, 3, dtype=torch.long)}, [n])


def make_buffer(
    client: FakeDataPlane | None = None, *, partition: str = PARTITION, group_size: int = G
) -> tuple[TQReplayBuffer, FakeDataPlane, DataPlaneCheckpointBarrier]:
    barrier = DataPlaneCheckpointBarrier()
    client = client or FakeDataPlane(barrier)
    client.barrier = barrier
    return TQReplayBuffer(client, barrier, partition=partition, group_size=group_size), client, barrier


def filled_sidecar(n_groups: int = 3) -> dict[str, Any]:
    buf, _, _ = make_buffer()

    async def fill() -> None:
        for i in range(n_groups):
            await buf.commit(f"p{i}", i, version=i // 2, data=rows())

    asyncio.run(fill())
    return buf.metadata_state_dict()


# ------------------------------------------------------------------------------------------------ buffer behaviour
def test_commit_and_drop_write_inside_a_barrier_slot() -> None:
    buf, client, barrier = make_buffer()

    async def body() -> None:
        await buf.commit("p0", 0, 0, rows())
        await buf.commit("p1", 1, 0, rows())
        await buf.drop(["p0"])

    asyncio.run(body())
    assert client.calls == ["put_samples", "put_samples", "clear_samples"]
    assert client.slots_during_writes == [1, 1, 1], "a data-plane write ran outside barrier.mutation()"
    assert barrier.active_mutations == 0
    assert buf.sample_ids() == set(client.rows) == {f"p1:{i}" for i in range(G)}
    assert len(buf) == 1 and buf.rows == G and buf.prompt_indices() == {1}


def test_commit_waits_while_a_checkpoint_window_is_held() -> None:
    buf, client, barrier = make_buffer()

    async def body() -> None:
        async with barrier.checkpoint():
            task = asyncio.create_task(buf.commit("p0", 0, 0, rows()))
            for _ in range(10):
                await asyncio.sleep(0)
            assert client.calls == [] and len(buf) == 0, "commit wrote during the checkpoint window"
            snapshot = buf.metadata_state_dict()
        await task
        assert snapshot["groups"] == {} and len(buf) == 1

    asyncio.run(body())


def test_commit_refuses_wrong_row_count_and_duplicates() -> None:
    buf, client, _ = make_buffer()

    async def body() -> None:
        with pytest.raises(ValueError, match="rows"):
            await buf.commit("p0", 0, 0, rows(G - 1))
        await buf.commit("p0", 0, 0, rows())
        with pytest.raises(ValueError, match="already committed"):
            await buf.commit("p0", 0, 0, rows())

    asyncio.run(body())
    assert client.calls == ["put_samples"]


def test_drop_of_frozen_rows_is_deferred_until_thaw() -> None:
    """A snapshot still reads the frozen rows: the group leaves the index now, its rows only at thaw()."""
    buf, client, _ = make_buffer()

    async def body() -> None:
        await buf.commit("p0", 0, 0, rows())
        await buf.commit("p1", 1, 0, rows())
        buf.freeze(buf.sample_ids())
        await buf.commit("p2", 2, 0, rows())  # committed after the capture: not frozen
        await buf.drop(["p0", "p2"])
        assert [g.group_id for g in buf.groups()] == ["p1"]
        assert "p0:0" in client.rows and "p2:0" not in client.rows  # p2 cleared at once, p0 deferred
        await buf.thaw()
        assert set(client.rows) == buf.sample_ids()  # what the next window checks
        await buf.drop(["p1"])

    asyncio.run(body())
    assert len(buf) == 0 and client.rows == {}


def test_a_drop_while_thaw_clears_is_not_lost() -> None:
    """Regression: a frozen group dropped while thaw() was clearing the deferred rows stayed in the data plane."""
    buf, client, _ = make_buffer()

    async def body() -> None:
        for i in range(3):
            await buf.commit(f"p{i}", i, 0, rows())
        buf.freeze(buf.sample_ids())
        await buf.drop(["p0"])
        thaw = asyncio.create_task(buf.thaw())
        await asyncio.sleep(0)  # thaw() is inside its clear now
        await buf.drop(["p1"])
        await thaw
        assert set(client.rows) == buf.sample_ids() == {f"p2:{r}" for r in range(G)}

    asyncio.run(body())


def test_a_drop_waiting_for_its_slot_while_thaw_runs_is_not_lost() -> None:
    """Regression: drop() decided "defer" before waiting for its barrier slot; thaw() ran meanwhile, so the
    group's rows were neither cleared nor deferred and the next window found more rows than the index."""
    buf, client, barrier = make_buffer()

    async def body() -> None:
        await buf.commit("p0", 0, 0, rows())
        buf.freeze(buf.sample_ids())
        async with barrier._cond:  # the slot's lock is busy: drop() waits at its entry
            dropping = asyncio.create_task(buf.drop(["p0"]))
            await asyncio.sleep(0.01)
            await buf.thaw()
        await dropping
        assert set(client.rows) == buf.sample_ids() == set()

    asyncio.run(body())


def test_write_fields_waits_for_thaw_only_to_rewrite_a_captured_field() -> None:
    buf, client, _ = make_buffer()
    adv = TensorDict({"advantage": torch.ones(G)}, [G])

    async def body() -> None:
        await buf.commit("p0", 0, 0, rows())
        buf.freeze(buf.sample_ids())
        await asyncio.wait_for(buf.write_fields(["p0"], adv), 5)  # a new field: no wait
        rewrite = asyncio.create_task(buf.write_fields(["p0"], TensorDict({"reward": torch.ones(G)}, [G])))
        await asyncio.sleep(0.05)
        assert not rewrite.done(), "a captured field was rewritten while the snapshot was still reading it"
        assert float(client.rows["p0:0"]["reward"]) == 0.0
        await buf.thaw()
        await asyncio.wait_for(rewrite, 5)
        assert float(client.rows["p0:0"]["reward"]) == 1.0
        assert buf.field_names_by_group() == {"p0": ["advantage", "reward", "tokens"]}

    asyncio.run(body())


def test_restored_groups_have_unknown_fields_so_every_write_waits() -> None:
    buf, _, _ = make_buffer()
    sd = filled_sidecar(1)
    buf.load_state_dict(sd, expected_digest=sd["digest"])
    gid = next(iter(sd["groups"]))
    assert buf.field_names_by_group() == {gid: None}

    async def body() -> None:
        buf.freeze(buf.sample_ids())
        w = asyncio.create_task(buf.write_fields([gid], TensorDict({"advantage": torch.ones(G)}, [G])))
        await asyncio.sleep(0.05)
        assert not w.done()
        await buf.thaw()
        await asyncio.wait_for(w, 5)

    asyncio.run(body())


def test_metadata_state_dict_holds_no_tensors_and_its_own_digest() -> None:
    sd = filled_sidecar(3)
    assert sd["schema_version"] == SIDECAR_SCHEMA_VERSION
    assert sd["partition"] == PARTITION and sd["group_size"] == G
    assert sd["digest"] == sidecar_digest(sd)
    assert sorted(sd["groups"]) == ["p0", "p1", "p2"]

    def walk(x: Any) -> None:
        assert not isinstance(x, torch.Tensor)
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list | tuple):
            for v in x:
                walk(v)

    walk(sd)
    canonical_bytes({k: v for k, v in sd.items()})  # plain JSON-able data only


def test_sidecar_survives_torch_save_weights_only(tmp_path: Path) -> None:
    sd = filled_sidecar(2)
    torch.save(sd, tmp_path / "replay_buffer_metadata.pt")
    back = torch.load(tmp_path / "replay_buffer_metadata.pt", weights_only=True)
    assert back == sd


def test_load_state_dict_rebuilds_index_without_touching_the_data_plane() -> None:
    sd = filled_sidecar(3)
    buf, client, _ = make_buffer()
    buf.load_state_dict(copy.deepcopy(sd), expected_digest=sd["digest"])
    assert client.calls == [], "load_state_dict must not call the data plane"
    assert len(buf) == 3 and buf.rows == 3 * G
    assert buf.prompt_indices() == {0, 1, 2}
    assert buf.metadata_state_dict() == sd
    assert [g.group_id for g in buf.groups()] == ["p0", "p1", "p2"]


# ------------------------------------------------------------------------------------------------ refusals
def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(sd: dict[str, Any]) -> None:
        node = sd
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value

    return edit


def _reseal(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    """Apply ``edit`` and recompute the stored digest, so only the targeted check can refuse it."""

    def both(sd: dict[str, Any]) -> None:
        edit(sd)
        sd["digest"] = sidecar_digest(sd)

    return both


REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "schema version": (_set(("schema_version",), 99), "schema_version"),
    "schema version missing": (lambda sd: sd.pop("schema_version"), "schema_version"),
    "partition": (_reseal(_set(("partition",), "eval")), "partition"),
    "group size": (_reseal(_set(("group_size",), G + 1)), "group size"),
    "no groups mapping": (_set(("groups",), [1, 2]), "groups"),
    "duplicate id across groups": (
        _reseal(_set(("groups", "p1", "sample_ids"), ["p0:0", "p1:1", "p1:2", "p1:3"])),
        "more than one group",
    ),
    "duplicate id inside a group": (
        _reseal(_set(("groups", "p1", "sample_ids"), ["p1:0", "p1:0", "p1:2", "p1:3"])),
        "distinct",
    ),
    "group too small": (_reseal(_set(("groups", "p1", "sample_ids"), ["p1:0", "p1:1"])), "p1"),
    "group too large": (
        _reseal(_set(("groups", "p2", "sample_ids"), [f"p2:{i}" for i in range(G + 1)])),
        "p2",
    ),
    "tampered index": (_set(("groups", "p1", "prompt_index"), 42), "does not match its own index"),
    "tampered digest": (_set(("digest",), "0" * 64), "does not match its own index"),
    "consistent but not what the data plane holds": (
        _reseal(lambda sd: sd["groups"].pop("p2")),
        "data-plane digest",
    ),
    # malformed records: still a SidecarError naming the group, never a KeyError/TypeError from deep inside
    "record missing version": (_reseal(lambda sd: sd["groups"]["p1"].pop("version")), "p1"),
    "record missing sample ids": (_reseal(lambda sd: sd["groups"]["p1"].pop("sample_ids")), "p1"),
    "record not a mapping": (_set(("groups", "p1"), ["p1:0", "p1:1", "p1:2", "p1:3"]), "p1"),
    "sample ids as one string": (_reseal(_set(("groups", "p1", "sample_ids"), "wxyz")), "p1"),
    "non-string sample id": (_reseal(_set(("groups", "p1", "sample_ids"), [1, 2, 3, 4])), "p1"),
    "float prompt index": (_set(("groups", "p1", "prompt_index"), 1.0), "p1"),
    "string version": (_reseal(_set(("groups", "p1", "version"), "0")), "p1"),
}


@pytest.mark.parametrize("what", sorted(REFUSALS))
def test_load_state_dict_refuses(what: str) -> None:
    sd = filled_sidecar(3)
    expected = sd["digest"]  # what the data-plane snapshot recorded for the real index
    edit, needle = REFUSALS[what]
    bad = copy.deepcopy(sd)
    edit(bad)
    buf, client, _ = make_buffer()
    with pytest.raises(SidecarError, match=needle):
        buf.load_state_dict(bad, expected_digest=expected)
    assert len(buf) == 0, "a refused sidecar left part of its index behind"
    assert client.calls == []
    buf.load_state_dict(copy.deepcopy(sd), expected_digest=expected)  # the untouched sidecar still loads
    assert len(buf) == 3


def test_load_state_dict_refuses_a_digest_from_another_snapshot() -> None:
    sd = filled_sidecar(3)
    other = filled_sidecar(2)
    buf, _, _ = make_buffer()
    with pytest.raises(SidecarError, match="data-plane digest"):
        buf.load_state_dict(sd, expected_digest=other["digest"])
    with pytest.raises(SidecarError, match="data-plane digest"):
        buf.load_state_dict(sd, expected_digest="")


def test_load_state_dict_refuses_a_mismatched_buffer_config() -> None:
    sd = filled_sidecar(1)
    for kwargs, needle in (({"partition": "eval"}, "partition"), ({"group_size": G * 2}, "group size")):
        buf, _, _ = make_buffer(**kwargs)  # type: ignore[arg-type]
        with pytest.raises(SidecarError, match=needle):
            buf.load_state_dict(copy.deepcopy(sd), expected_digest=sd["digest"])


def test_load_state_dict_needs_an_empty_index() -> None:
    sd = filled_sidecar(1)
    buf, _, _ = make_buffer()
    asyncio.run(buf.commit("p5", 5, 0, rows()))
    with pytest.raises(SidecarError, match="empty index"):
        buf.load_state_dict(sd, expected_digest=sd["digest"])
    assert buf.prompt_indices() == {5}
