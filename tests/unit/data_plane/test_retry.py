"""data_plane.retry: a failed data-plane call is retried (bounded, backed off, counted) and a put that still fails
leaves no row behind — pure logic against the in-memory ``FakeDataPlane``, through the real ``TQReplayBuffer``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from sc_app.data_plane.client import DataPlaneDetached
from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer
from sc_app.data_plane.retry import DataPlaneCallFailed, DataPlaneFault, RetryingClient, RetryPolicy, policy_of
from sc_app.observe.observer import translate
from sc_app.progress import format_line
from tests.support.fake_data_plane import FakeDataPlane
from tests.unit.data_plane.test_replay_buffer import PARTITION, G, rows


class Flaky(FakeDataPlane):
    """Fails the next ``fails[op]`` calls of ``op`` after doing half of their rows (a partial put / clear)."""

    def __init__(self) -> None:
        super().__init__()
        self.fails: dict[str, int] = {}
        self.indexes = {}

    def _fail(self, op: str) -> bool:
        if self.fails.get(op, 0) > 0:
            self.fails[op] -= 1
            return True
        return False

    async def put_samples(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: Any = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> list[int] | None:
        op = "put" if global_indexes is None else "write"
        if self._fail(op):
            half = len(sample_ids) // 2
            gis = None if global_indexes is None else global_indexes[:half]
            await super().put_samples(
                partition, sample_ids[:half], data[:half], tags and tags[:half], global_indexes=gis
            )
            raise ConnectionError(f"storage unit unreachable during {op}")
        return await super().put_samples(partition, sample_ids, data, tags, global_indexes=global_indexes)

    async def clear_samples(
        self, partition: str, sample_ids: list[str], *, global_indexes: list[int] | None = None
    ) -> None:
        if self._fail("clear"):
            half = len(sample_ids) // 2
            await super().clear_samples(
                partition, sample_ids[:half], global_indexes=None if global_indexes is None else global_indexes[:half]
            )
            raise TimeoutError("clear timed out")
        await super().clear_samples(partition, sample_ids, global_indexes=global_indexes)


def setup(attempts: int = 3) -> tuple[TQReplayBuffer, Flaky, RetryingClient, list[DataPlaneFault], list[float]]:
    fake = Flaky()
    faults: list[DataPlaneFault] = []
    waits: list[float] = []

    async def no_sleep(s: float) -> None:
        waits.append(s)

    client = RetryingClient(
        fake, RetryPolicy(attempts, backoff_s=0.1, max_backoff_s=0.25), on_fault=faults.append, sleep=no_sleep
    )
    from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier

    barrier = DataPlaneCheckpointBarrier()
    fake.barrier = barrier
    return TQReplayBuffer(client, barrier, partition=PARTITION, group_size=G), fake, client, faults, waits


def commit(buf: TQReplayBuffer, *gids: str) -> None:
    commits = [GroupCommit(gid, i, 0) for i, gid in enumerate(gids)]
    asyncio.run(buf.commit_groups(commits, rows(G * len(gids))))


def inventory_holds(buf: TQReplayBuffer, fake: Flaky) -> bool:
    return buf.sample_ids() == set(fake.rows)


def test_a_partial_put_is_retried_and_recovers() -> None:
    buf, fake, client, faults, waits = setup()
    fake.fails["put"] = 2
    commit(buf, "p0", "p1")
    assert inventory_holds(buf, fake) and len(buf) == 2
    assert buf.global_indexes(["p0", "p1"]) == [fake.indexes[f"{g}:{r}"] for g in ("p0", "p1") for r in range(G)]
    assert waits == [0.1, 0.2], "exponential backoff before each retry"
    (fault,) = faults
    assert (fault.op, fault.outcome, fault.attempts, fault.rows_removed) == ("put", "recovered", 3, 0)
    assert fault.detection_seconds >= 0 and fault.recovery_seconds >= 0
    assert "storage unit unreachable" in fault.error
    assert client.stats.retries["put"] == 2 and client.stats.faults[("put", "recovered")] == 1


def test_a_put_that_keeps_failing_removes_the_rows_it_wrote_then_raises() -> None:
    buf, fake, _client, faults, waits = setup()
    commit(buf, "p0")
    fake.fails["put"] = 3
    with pytest.raises(DataPlaneCallFailed, match=r"put of 8 rows failed 3 times.*4 rows it had written were removed"):
        commit(buf, "p1", "p2")
    assert inventory_holds(buf, fake), "a failed put left rows the index does not list"
    assert [g.group_id for g in buf.groups()] == ["p0"]
    assert waits == [0.1, 0.2], "bounded: 3 attempts, 2 waits"
    assert [(f.op, f.outcome, f.rows_removed) for f in faults] == [("put", "rolled_back", 4)]
    commit(buf, "p1")  # the group id is free again and the run goes on
    assert inventory_holds(buf, fake) and len(buf) == 2


def test_a_partial_clear_is_retried_by_key_and_recovers() -> None:
    buf, fake, _client, faults, _ = setup()
    commit(buf, "p0", "p1", "p2")
    fake.fails["clear"] = 1
    asyncio.run(buf.drop(["p0", "p1"]))
    assert inventory_holds(buf, fake) and [g.group_id for g in buf.groups()] == ["p2"]
    assert fake.by_index == ["clear"], "the retry clears by key: freed indexes may belong to new rows already"
    assert [(f.op, f.outcome, f.attempts) for f in faults] == [("clear", "recovered", 2)]


def test_a_fenced_client_reaches_no_data_plane_not_even_a_retry_in_flight() -> None:
    """A clear failed (its storage unit died) and waits to retry; meanwhile the controller is halted for a warm
    in-job restore (``fence``). The retry would list and clear by key — on the rebuilt data plane, which TransferQueue's
    per-process client attaches to, removing restored rows of the same ids. It is refused, not retried, and not
    reported as a data-plane fault; every later call is refused too."""
    buf, fake, client, faults, _ = setup()
    commit(buf, "p0", "p1")
    fake.fails["clear"] = 1

    async def halted_while_waiting(s: float) -> None:
        client.fence("halted")

    client._sleep = halted_while_waiting
    before = list(fake.calls)
    with pytest.raises(DataPlaneDetached, match="fenced: halted"):
        asyncio.run(buf.drop(["p0"]))
    assert fake.calls[len(before) :] == ["clear_samples"], "only the first attempt reached the data plane"
    assert faults == [] and client.stats.retries["clear"] == 1
    for call in (client.list_samples(PARTITION), client.get_samples(PARTITION, ["p1:0"], ["reward"])):
        with pytest.raises(DataPlaneDetached):
            asyncio.run(call)
    assert fake.calls[len(before) :] == ["clear_samples"]


def test_an_advantage_write_is_rewritten_until_it_lands() -> None:
    buf, fake, _client, faults, _ = setup()
    commit(buf, "p0")
    fake.fails["write"] = 2
    adv = torch.arange(G, dtype=torch.float32)
    asyncio.run(buf.write_fields(["p0"], TensorDict({"advantage": adv}, [G])))
    assert [fake.rows[f"p0:{r}"]["advantage"].item() for r in range(G)] == adv.tolist()
    assert inventory_holds(buf, fake)
    assert [(f.op, f.outcome, f.attempts, f.rows_removed) for f in faults] == [("write", "recovered", 3, 0)]


def test_a_failed_write_removes_nothing() -> None:
    buf, fake, _client, faults, _ = setup(attempts=2)
    commit(buf, "p0")
    fake.fails["write"] = 2
    with pytest.raises(DataPlaneCallFailed):
        asyncio.run(buf.write_fields(["p0"], TensorDict({"advantage": torch.ones(G)}, [G])))
    assert inventory_holds(buf, fake) and len(buf) == 1, "the rows are the index's: they stay"
    assert [f.outcome for f in faults] == ["failed"]


def test_refused_arguments_are_not_retried() -> None:
    _, fake, client, faults, waits = setup()
    calls = []

    async def refuses(*args: Any, **kw: Any) -> None:
        calls.append(args)
        raise ValueError("1 sample ids for 2 rows")

    fake.put_samples = refuses  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="sample ids"):
        asyncio.run(client.put_samples(PARTITION, ["a:0"], rows(2)))
    assert len(calls) == 1 and waits == [] and faults == [], "the same call fails the same way: no retry"


def test_no_fault_costs_nothing() -> None:
    buf, fake, client, faults, waits = setup()
    commit(buf, "p0", "p1")
    asyncio.run(buf.drop(["p0"]))
    assert faults == [] and waits == [] and not client.stats.retries
    assert fake.calls == ["put_samples", "clear_samples"]


def test_backoff_is_bounded_and_the_policy_is_checked() -> None:
    policy = RetryPolicy(attempts=6, backoff_s=0.5, max_backoff_s=2.0)
    assert [policy.wait_before(k) for k in range(1, 6)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert policy_of(3, 0.05) == RetryPolicy(4, 0.05)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


def test_a_fault_becomes_a_run_log_event_and_a_printed_line() -> None:
    fault = DataPlaneFault("put", "recovered", 3, 16, 0.01, 0.3, 0, "ConnectionError: unreachable")
    record = fault.record(step=7)
    step, events = translate(record)
    assert step is None
    (ev,) = events
    assert ev.name == "fault" and ev.step == 7
    assert ev.data["fault"] == "data_plane.put" and ev.data["outcome"] == "recovered" and ev.data["attempts"] == 3
    assert ev.data["prompts_lost"] == ev.data["prompts_duplicated"] == ev.data["steps_redone"] == 0
    assert ev.data["recovery_s"] == 0.3 and ev.data["detection_s"] == 0.01
    line = format_line(record, 10)
    assert line.startswith("step    7/10  fault data_plane.put: recovered after 3 attempts")
