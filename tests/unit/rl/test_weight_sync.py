"""The weight-sync seam (``sc_app.rl.weight_sync``): the push every caller shares (rank 0's weights to each worker,
every trainer rank taking part, a dead worker skipped only where asked, the version each worker holds). Fake actor
handles stand in for Ray's (the real ones: tests/e2e/test_generation_restart.py, test_run.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from sc_app.rl.weight_sync.push import PushResult, WeightSync  # noqa: E402
from tests.support.fake_workers import FakeActor  # noqa: E402


class Trainer(FakeActor):
    def __init__(self, rank: int, fail: BaseException | None = None) -> None:
        self._rank, self._fail, self._log = rank, fail, []

    def get_weights(self) -> dict[str, torch.Tensor] | None:
        self._log.append(("get_weights", None))
        if self._fail is not None:
            raise self._fail
        return {"w": torch.ones(2)} if self._rank == 0 else None


class Worker(FakeActor):
    def __init__(self, fail: BaseException | None = None) -> None:
        self._fail, self._log = fail, []

    def set_weights(self, weights: Any, version: int) -> int:
        if self._fail is not None:
            raise self._fail
        self._log.append(("set_weights", (weights, version)))
        return version


def test_a_push_gives_rank_0s_weights_to_every_worker_with_every_rank_taking_part() -> None:
    trainers, workers = [Trainer(0), Trainer(1)], [Worker(), Worker(), Worker()]
    sync = WeightSync(trainers)
    assert sync.held(workers[0]) is None and sync.is_stale(workers[0], 0)
    assert asyncio.run(sync.push(workers, 4)) == PushResult(4, reached=3)
    assert all(len(t.called("get_weights")) == 1 for t in trainers), "every rank takes part once per version"
    (first,) = workers[0].called("set_weights")
    assert first[1] == 4 and torch.equal(first[0]["w"], torch.ones(2))
    assert all(w.called("set_weights")[0][0] is first[0] for w in workers), "one object for every worker"
    assert [sync.held(w) for w in workers] == [4, 4, 4]
    assert not sync.is_stale(workers[1], 4) and sync.is_stale(workers[1], 5)


def test_the_other_ranks_part_is_awaited_and_its_error_raised() -> None:
    sync = WeightSync([Trainer(0), Trainer(1, fail=RuntimeError("gather failed on rank 1"))])
    with pytest.raises(RuntimeError, match="gather failed on rank 1"):
        asyncio.run(sync.push([Worker()], 1, skip_dead=True))


def test_a_dead_worker_is_skipped_and_forgotten_only_where_asked() -> None:
    alive, dead = Worker(), Worker()
    sync = WeightSync([Trainer(0)])
    asyncio.run(sync.push([alive, dead], 1))
    dead._fail = ray.exceptions.RayActorError()
    assert asyncio.run(sync.push([alive, dead], 2, skip_dead=True)) == PushResult(2, reached=1, skipped=(1,))
    assert sync.held(alive) == 2 and sync.held(dead) is None
    with pytest.raises(ray.exceptions.RayActorError):
        asyncio.run(sync.push([dead], 3))  # a replacement's push: its death is an error
    broken = Worker(fail=RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(sync.push([alive, broken], 4, skip_dead=True))
    assert sync.held(alive) == 4, "the workers that loaded the version hold it"


def test_a_blocking_push_waits_on_every_call_with_the_given_get() -> None:
    class Handle:
        def __init__(self, name: str) -> None:
            self.get_weights = self.set_weights = self
            self.name = name

        def remote(self, *args: Any) -> str:
            return f"{self.name}{args}"

    waited: list[list[Any]] = []
    sync = WeightSync([Handle("t0"), Handle("t1")])
    workers = [Handle("g0"), Handle("g1")]
    assert sync.push_blocking(workers, 3, get=waited.append) == PushResult(3, reached=2)
    assert waited == [["g0('t0()', 3)", "g1('t0()', 3)", "t1()"]], "workers get rank 0's ref; rank 1 is awaited"
    assert [sync.held(w) for w in workers] == [3, 3]

    def failing(refs: list[Any]) -> None:
        raise RuntimeError("a worker's load failed")

    with pytest.raises(RuntimeError, match="load failed"):
        sync.push_blocking(workers, 4, get=failing)
    assert [sync.held(w) for w in workers] == [3, 3], "nothing recorded for a version that did not land"
