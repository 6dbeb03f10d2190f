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

from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer
from sc_app.data_plane.replay_index import SIDECAR_SCHEMA_VERSION, SidecarError
from sc_app.io.digest import canonical_bytes, sidecar_digest
from tests.support.fake_data_plane import FakeDataPlane, until

G = 4
PARTITION = "train"


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
            await until(lambda: bool(barrier._cond._lock._waiters))  # type: ignore[attr-defined]  # drop() queued
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
        await until(lambda: buf.writes_waiting == 1 or rewrite.done())  # parked at the freeze, or (a bug) through
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
        await until(lambda: buf.writes_waiting == 1 or w.done())
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


# ------------------------------------------------------------------------------------------------ batched commits
def batch(*gids: str, version: int = 0) -> list[GroupCommit]:
    return [GroupCommit(gid, int(gid[1:]), version) for gid in gids]


def test_commit_groups_is_one_put_in_one_slot_with_every_row_tagged() -> None:
    buf, client, barrier = make_buffer()

    async def body() -> None:
        groups = await buf.commit_groups(batch("p0", "p1", "p2", version=3), rows(3 * G, 1.0))
        assert [g.group_id for g in groups] == ["p0", "p1", "p2"]

    asyncio.run(body())
    assert client.calls == ["put_samples"] and client.slots_during_writes == [1]
    assert barrier.stats.mutations == 1 and barrier.active_mutations == 0
    assert client.put_keys == [[f"p{g}:{r}" for g in range(3) for r in range(G)]], "rows must go in group order"
    assert client.tags == {f"p{g}:{r}": {"group": f"p{g}", "version": 3} for g in range(3) for r in range(G)}
    assert [g.group_id for g in buf.groups()] == ["p0", "p1", "p2"] and buf.prompt_indices() == {0, 1, 2}
    assert buf.field_names_by_group() == {gid: ["reward", "tokens"] for gid in ("p0", "p1", "p2")}
    assert buf.times.put > 0 and buf.times.put_wait >= 0


def test_a_window_sees_all_of_a_batch_or_none_of_it() -> None:
    """A checkpoint asking while a batch is inside its put waits for the whole put; one asked before the batch got
    its slot sees none of it. Either way index == stored rows inside the window."""
    buf, client, barrier = make_buffer()
    client.put_gate = asyncio.Event()

    async def body() -> None:
        committing = asyncio.create_task(buf.commit_groups(batch("p0", "p1"), rows(2 * G)))
        while not client.put_keys:
            await asyncio.sleep(0)
        window = asyncio.create_task(_window_view(buf, client, barrier))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not window.done(), "the window opened while a batch was half-way through its put"
        client.put_gate.set()
        await committing
        seen_index, seen_rows = await window
        assert seen_index == seen_rows == {f"p{g}:{r}" for g in range(2) for r in range(G)}

        async with barrier.checkpoint():  # a batch asking while the window is held waits, index untouched
            late = asyncio.create_task(buf.commit_groups(batch("p2", "p3"), rows(2 * G)))
            for _ in range(20):
                await asyncio.sleep(0)
            assert buf.sample_ids() == set(client.rows) and "p2" not in {g.group_id for g in buf.groups()}
        await late
        assert {g.group_id for g in buf.groups()} == {"p0", "p1", "p2", "p3"}

    asyncio.run(body())


async def _window_view(
    buf: TQReplayBuffer, client: FakeDataPlane, barrier: DataPlaneCheckpointBarrier
) -> tuple[set[str], set[str]]:
    async with barrier.checkpoint():
        return buf.sample_ids(), set(client.rows)


def test_commit_groups_refusals_put_nothing() -> None:
    buf, client, _ = make_buffer()

    async def body() -> None:
        with pytest.raises(ValueError, match="expected 8"):
            await buf.commit_groups(batch("p0", "p1"), rows(2 * G - 1))
        with pytest.raises(ValueError, match="p1 twice"):
            await buf.commit_groups(batch("p1", "p1"), rows(2 * G))
        await buf.commit_groups(batch("p0"), rows(G))
        with pytest.raises(ValueError, match="p0 is already committed"):
            await buf.commit_groups(batch("p5", "p0"), rows(2 * G))
        assert await buf.commit_groups([], rows(0)) == []

    asyncio.run(body())
    assert client.put_keys == [[f"p0:{r}" for r in range(G)]]
    assert [g.group_id for g in buf.groups()] == ["p0"]


def test_concurrent_batches_cannot_commit_one_group_twice() -> None:
    buf, client, _ = make_buffer()
    client.put_gate = asyncio.Event()

    async def body() -> None:
        first = asyncio.create_task(buf.commit_groups(batch("p0", "p1"), rows(2 * G)))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="p1 is already committed"):
            await buf.commit_groups(batch("p1", "p2"), rows(2 * G))
        client.put_gate.set()
        await first

    asyncio.run(body())
    assert len(client.put_keys) == 1 and [g.group_id for g in buf.groups()] == ["p0", "p1"]


def test_a_failed_batch_leaves_the_index_as_it_was_and_can_be_retried() -> None:
    buf, client, barrier = make_buffer()

    async def body() -> None:
        client.fail_puts = True
        with pytest.raises(ConnectionError):
            await buf.commit_groups(batch("p0", "p1"), rows(2 * G))
        assert len(buf) == 0 and barrier.active_mutations == 0
        client.fail_puts = False
        await buf.commit_groups(batch("p0", "p1"), rows(2 * G))

    asyncio.run(body())
    assert [g.group_id for g in buf.groups()] == ["p0", "p1"]


def test_drop_clears_groups_of_several_batches_with_one_call() -> None:
    buf, client, _ = make_buffer()

    async def body() -> None:
        await buf.commit_groups(batch("p0", "p1"), rows(2 * G))
        await buf.commit_groups(batch("p2", "p3"), rows(2 * G))
        client.calls.clear()
        await buf.drop(["p1", "p2", "p3"])

    asyncio.run(body())
    assert client.calls == ["clear_samples"]
    assert set(client.rows) == buf.sample_ids() == {f"p0:{r}" for r in range(G)}
    assert buf.times.clear > 0


def test_a_frozen_batch_member_dropped_with_others_is_cleared_at_thaw() -> None:
    buf, client, _ = make_buffer()

    async def body() -> None:
        await buf.commit_groups(batch("p0", "p1"), rows(2 * G))
        buf.freeze(buf.sample_ids())
        await buf.commit_groups(batch("p2", "p3"), rows(2 * G))
        await buf.drop(["p1", "p2"])
        assert {sid.split(":")[0] for sid in client.rows} == {"p0", "p1", "p3"}  # p1 deferred, p2 cleared
        await buf.thaw()
        assert set(client.rows) == buf.sample_ids()
        assert buf.times.thaw_clear > 0

    asyncio.run(body())


def test_a_drop_waits_for_an_advantage_write_in_flight_on_its_groups() -> None:
    """Regression (found by the randomized integration test): a drop cleared the rows while an advantage write's
    put was in flight; the put landed after the clear and re-created the rows outside the index."""
    buf, client, _ = make_buffer()

    async def body() -> None:
        await buf.commit_groups(batch("p0", "p1"), rows(2 * G))
        client.put_gate = asyncio.Event()
        writing = asyncio.create_task(buf.write_fields(["p0"], TensorDict({"advantage": torch.ones(G)}, [G])))
        while len(client.put_keys) < 2:
            await asyncio.sleep(0)
        dropping = asyncio.create_task(buf.drop(["p0"]))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not dropping.done() and "clear_samples" not in client.calls, "the drop did not wait for the write"
        with pytest.raises(KeyError, match="being dropped"):
            await buf.write_fields(["p0"], TensorDict({"advantage": torch.ones(G)}, [G]))
        client.put_gate.set()
        await asyncio.gather(writing, dropping)
        assert set(client.rows) == buf.sample_ids() == {f"p1:{r}" for r in range(G)}

    asyncio.run(body())


def test_known_global_indexes_are_reused_until_the_rows_are_cleared() -> None:
    """The indexes a commit's put returned spare later calls on the same rows their key lookup; they are given
    back exactly (the fake asserts it), with the tags on a put, and forgotten once the rows are cleared."""
    buf, client, _ = make_buffer()
    client.indexes = {}

    async def body() -> None:
        await buf.commit_groups(batch("p0", "p1"), rows(2 * G))
        await buf.commit_groups(batch("p2", version=2), rows(G))
        assert buf.global_indexes(["p2", "p0"]) == [client.indexes[f"{g}:{r}"] for g in ("p2", "p0") for r in range(G)]
        await buf.write_fields(["p1", "p2"], TensorDict({"advantage": torch.ones(2 * G)}, [2 * G]))
        assert client.tags["p2:0"] == {"group": "p2", "version": 2}, "a put by index rewrote the tags"
        buf.freeze(buf.sample_ids())
        await buf.drop(["p0"])  # frozen: cleared by thaw, by index
        await buf.thaw()
        await buf.drop(["p1", "p2"])
        assert buf.global_indexes([]) == []

    asyncio.run(body())
    assert client.by_index == ["put", "clear", "clear"]
    assert client.rows == {} and client.indexes == {}


def test_groups_without_known_indexes_are_looked_up() -> None:
    """Restored groups (and adapters that do not return indexes) take the lookup path."""
    sd = filled_sidecar(2)
    buf, client, _ = make_buffer()
    client.indexes = {}
    buf.load_state_dict(sd, expected_digest=sd["digest"])
    assert buf.global_indexes(["p0"]) is None
    for gid in ("p0", "p1"):  # what the restore put back
        for r in range(G):
            client.rows[f"{gid}:{r}"] = {"reward": torch.tensor(0.0)}
            client.indexes[f"{gid}:{r}"] = len(client.indexes)

    async def body() -> None:
        await buf.commit_groups(batch("p5"), rows(G))
        await buf.write_fields(["p0", "p5"], TensorDict({"advantage": torch.ones(2 * G)}, [2 * G]))
        await buf.drop(["p0", "p5"])

    asyncio.run(body())
    assert client.by_index == [], "a call mixing a group of unknown indexes must look every row up"
    assert set(client.rows) == buf.sample_ids() == {f"p1:{r}" for r in range(G)}


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
