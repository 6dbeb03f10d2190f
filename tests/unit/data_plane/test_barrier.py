"""Unit tests for ``DataPlaneCheckpointBarrier`` (plain asyncio; milliseconds each, no Ray, no torch).

What is pinned here (issue 2, item 3):
* many mutations run concurrently; a checkpoint waits for the ones in flight and blocks new ones while it is
  waiting or held (writer preference), and only one checkpoint window exists at a time;
* cancelling a waiter or a holder at any await point leaves the counters as they were and blocks nobody;
* a seeded randomized stress test never observes a mutation inside a checkpoint window, and everything finishes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import pytest

from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier

T = TypeVar("T")


def run(coro_fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 5.0) -> T:
    """Run one test coroutine with a hard deadline, so a deadlock fails instead of hanging the suite."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro_fn(), timeout)

    return asyncio.run(bounded())


async def settle(n: int = 5) -> None:
    """Let every runnable task advance a few steps."""
    for _ in range(n):
        await asyncio.sleep(0)


def assert_idle(b: DataPlaneCheckpointBarrier) -> None:
    """Nothing held, nothing pending, nothing counted."""
    assert b.active_mutations == 0
    assert not b.checkpoint_held
    assert not b._checkpoint_pending
    assert not b._cond.locked()


async def assert_usable(b: DataPlaneCheckpointBarrier) -> None:
    """A fresh mutation and a fresh checkpoint both get through at once (nobody was left blocking)."""
    async with asyncio.timeout(1.0):
        async with b.mutation():
            assert b.active_mutations >= 1
        async with b.checkpoint():
            assert b.checkpoint_held and b.active_mutations == 0
    assert_idle(b)


class Holder:
    """A task that enters a barrier block, signals ``entered``, then stays inside until ``release`` is set."""

    def __init__(self, cm_factory: Callable[[], Any]) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.exited = False
        self.task = asyncio.create_task(self._body(cm_factory))

    async def _body(self, cm_factory: Callable[[], Any]) -> None:
        async with cm_factory():
            self.entered.set()
            await self.release.wait()
        self.exited = True


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# ------------------------------------------------------------------------------------------------ basics
def test_many_mutations_run_concurrently() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        holders = [Holder(b.mutation) for _ in range(50)]
        await asyncio.gather(*(h.entered.wait() for h in holders))
        assert b.active_mutations == 50
        for h in holders:
            h.release.set()
        await asyncio.gather(*(h.task for h in holders))
        assert b.stats.mutations == 50
        assert_idle(b)

    run(body)


def test_checkpoint_waits_for_in_flight_mutations() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        muts = [Holder(b.mutation) for _ in range(3)]
        await asyncio.gather(*(m.entered.wait() for m in muts))
        ckpt = Holder(b.checkpoint)
        await settle()
        assert not ckpt.entered.is_set(), "checkpoint entered while 3 mutations were in flight"
        assert b._checkpoint_pending
        muts[0].release.set()
        muts[1].release.set()
        await settle()
        assert not ckpt.entered.is_set(), "checkpoint entered while a mutation was still in flight"
        muts[2].release.set()
        await asyncio.wait_for(ckpt.entered.wait(), 1)
        assert b.checkpoint_held and b.active_mutations == 0
        ckpt.release.set()
        await ckpt.task
        assert b.stats.checkpoints == 1 and len(b.stats.checkpoint_windows) == 1
        assert_idle(b)

    run(body)


def test_pending_checkpoint_blocks_new_mutations_writer_preference() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        first = Holder(b.mutation)
        await first.entered.wait()
        ckpt = Holder(b.checkpoint)
        await settle()
        assert b._checkpoint_pending
        late = Holder(b.mutation)  # arrives after the checkpoint asked: must wait behind it
        await settle()
        assert not late.entered.is_set(), "a new mutation overtook a pending checkpoint (no writer preference)"
        assert b.active_mutations == 1
        first.release.set()
        await asyncio.wait_for(ckpt.entered.wait(), 1)
        await settle()
        assert not late.entered.is_set(), "a mutation entered while the checkpoint window was held"
        ckpt.release.set()
        await asyncio.wait_for(late.entered.wait(), 1)
        late.release.set()
        await asyncio.gather(first.task, ckpt.task, late.task)
        assert_idle(b)

    run(body)


def test_steady_commit_stream_cannot_starve_a_checkpoint() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        stop = asyncio.Event()

        async def committer() -> None:
            while not stop.is_set():
                async with b.mutation():
                    await asyncio.sleep(0.001)

        writers = [asyncio.create_task(committer()) for _ in range(8)]
        await asyncio.sleep(0.01)
        async with asyncio.timeout(1.0):  # would time out if overlapping mutations kept the count above zero
            async with b.checkpoint():
                assert b.active_mutations == 0
        stop.set()
        await asyncio.gather(*writers)
        assert_idle(b)

    run(body)


def test_one_checkpoint_at_a_time() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        inside = 0
        peak = 0

        async def ckpt() -> None:
            nonlocal inside, peak
            async with b.checkpoint():
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.002)
                inside -= 1

        first = Holder(b.checkpoint)
        await first.entered.wait()
        second = Holder(b.checkpoint)
        await settle()
        assert not second.entered.is_set(), "a second checkpoint window opened while one was held"
        first.release.set()
        await asyncio.wait_for(second.entered.wait(), 1)
        second.release.set()
        await asyncio.gather(first.task, second.task, *(ckpt() for _ in range(10)))
        assert peak == 1
        assert b.stats.checkpoints == 12
        assert_idle(b)

    run(body)


def test_errors_inside_blocks_release_the_barrier() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        with pytest.raises(RuntimeError, match="boom"):
            async with b.mutation():
                raise RuntimeError("boom")
        assert_idle(b)
        with pytest.raises(RuntimeError, match="bang"):
            async with b.checkpoint():
                raise RuntimeError("bang")
        assert_idle(b)
        await assert_usable(b)

    run(body)


# ------------------------------------------------------------------------------------------------ cancellation
def test_cancel_mutation_waiting_behind_held_checkpoint() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        ckpt = Holder(b.checkpoint)
        await ckpt.entered.wait()
        waiting = Holder(b.mutation)
        await settle()
        assert not waiting.entered.is_set()
        await cancel_and_wait(waiting.task)
        assert b.active_mutations == 0 and b.checkpoint_held
        ckpt.release.set()
        await ckpt.task
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_mutation_waiting_behind_pending_checkpoint() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        first = Holder(b.mutation)
        await first.entered.wait()
        ckpt = Holder(b.checkpoint)
        await settle()
        waiting = Holder(b.mutation)
        await settle()
        await cancel_and_wait(waiting.task)
        assert b.active_mutations == 1 and b._checkpoint_pending
        first.release.set()
        await asyncio.wait_for(ckpt.entered.wait(), 1)
        ckpt.release.set()
        await asyncio.gather(first.task, ckpt.task)
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_checkpoint_waiting_for_mutations_unblocks_new_mutations() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        first = Holder(b.mutation)
        await first.entered.wait()
        ckpt = Holder(b.checkpoint)
        await settle()
        blocked = Holder(b.mutation)
        await settle()
        assert b._checkpoint_pending and not blocked.entered.is_set()
        await cancel_and_wait(ckpt.task)
        # The cancelled checkpoint withdrew its claim: the blocked mutation runs alongside the first one.
        assert not b._checkpoint_pending and not b.checkpoint_held
        await asyncio.wait_for(blocked.entered.wait(), 1)
        assert b.active_mutations == 2
        first.release.set()
        blocked.release.set()
        await asyncio.gather(first.task, blocked.task)
        assert b.stats.checkpoints == 0
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_checkpoint_queued_behind_another_checkpoint() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        first = Holder(b.checkpoint)
        await first.entered.wait()
        queued = Holder(b.checkpoint)
        await settle()
        await cancel_and_wait(queued.task)
        assert b.checkpoint_held and not b._checkpoint_pending
        first.release.set()
        await first.task
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_held_checkpoint_releases_window() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        ckpt = Holder(b.checkpoint)
        await ckpt.entered.wait()
        waiting = Holder(b.mutation)
        await settle()
        await cancel_and_wait(ckpt.task)
        assert not ckpt.exited
        await asyncio.wait_for(waiting.entered.wait(), 1)
        waiting.release.set()
        await waiting.task
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_held_mutation_releases_slot() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        muts = [Holder(b.mutation) for _ in range(3)]
        await asyncio.gather(*(m.entered.wait() for m in muts))
        ckpt = Holder(b.checkpoint)
        await settle()
        for m in muts:
            await cancel_and_wait(m.task)
        await asyncio.wait_for(ckpt.entered.wait(), 1)
        assert b.active_mutations == 0
        ckpt.release.set()
        await ckpt.task
        assert_idle(b)

    run(body)


def test_cancel_while_acquiring_the_internal_lock() -> None:
    """The very first await of each entry point is the lock; cancelling there changes nothing."""

    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        await b._cond.acquire()
        try:
            mut = Holder(b.mutation)
            ckpt = Holder(b.checkpoint)
            await settle()
            await cancel_and_wait(mut.task)
            await cancel_and_wait(ckpt.task)
        finally:
            b._cond.release()
        assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_during_release_still_releases() -> None:
    """A cancel that lands while the release waits for the lock must not leak the slot or the window."""

    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        for factory, held in ((b.mutation, lambda: b.active_mutations == 1), (b.checkpoint, lambda: b.checkpoint_held)):
            h = Holder(factory)
            await h.entered.wait()
            await b._cond.acquire()  # make the release block on the lock
            h.release.set()
            await settle()
            assert held(), "released without the lock?"
            h.task.cancel()  # lands on the shielded release
            await settle()
            b._cond.release()
            with pytest.raises(asyncio.CancelledError):
                await h.task
            await settle()
            assert_idle(b)
        await assert_usable(b)

    run(body)


def test_cancel_every_waiter_at_once_leaves_nothing_behind() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        running = [Holder(b.mutation) for _ in range(5)]
        await asyncio.gather(*(m.entered.wait() for m in running))
        ckpts = [Holder(b.checkpoint) for _ in range(3)]
        late = [Holder(b.mutation) for _ in range(5)]
        await settle()
        for h in [*running, *ckpts, *late]:
            h.task.cancel()
        await asyncio.gather(*(h.task for h in [*running, *ckpts, *late]), return_exceptions=True)
        assert_idle(b)
        await assert_usable(b)

    run(body)


# ------------------------------------------------------------------------------------------------ stress
def stress(seed: int, barrier: DataPlaneCheckpointBarrier, n_tasks: int = 400) -> dict[str, int]:
    """Random mix of mutations and checkpoints with random sleeps and cancels; counts invariant violations."""
    rng = random.Random(seed)
    b = barrier

    async def body() -> dict[str, int]:
        state = {"mutating": 0, "checkpointing": 0, "violations": 0, "mut_done": 0, "ckpt_done": 0, "cancelled": 0}

        async def jitter() -> None:
            r = rng.random()
            if r < 0.3:
                await asyncio.sleep(0)
            elif r < 0.9:
                await asyncio.sleep(rng.random() * 0.002)
            # else: no await at all

        def check_mutation() -> None:
            if state["checkpointing"] or b.checkpoint_held:
                state["violations"] += 1

        def check_checkpoint() -> None:
            if state["mutating"] or b.active_mutations or state["checkpointing"] > 1:
                state["violations"] += 1

        async def mutation() -> None:
            await jitter()
            async with b.mutation():
                state["mutating"] += 1
                try:
                    check_mutation()
                    await jitter()
                    check_mutation()
                finally:  # a cancel inside the block still leaves it
                    state["mutating"] -= 1
            state["mut_done"] += 1

        async def checkpoint() -> None:
            await jitter()
            async with b.checkpoint():
                state["checkpointing"] += 1
                try:
                    check_checkpoint()
                    await jitter()
                    check_checkpoint()
                finally:
                    state["checkpointing"] -= 1
            state["ckpt_done"] += 1

        tasks: list[asyncio.Task[None]] = []
        for _ in range(n_tasks):
            tasks.append(asyncio.create_task(checkpoint() if rng.random() < 0.15 else mutation()))
            if rng.random() < 0.3:
                await jitter()
            if rng.random() < 0.1:
                victim = rng.choice(tasks)
                if not victim.done():
                    victim.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        state["cancelled"] = sum(isinstance(r, asyncio.CancelledError) for r in results)
        errors = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
        assert not errors, errors
        return state

    return run(body, timeout=20)


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_randomized_stress_never_mutation_inside_checkpoint(seed: int) -> None:
    b = DataPlaneCheckpointBarrier()
    state = stress(seed, b)
    assert state["violations"] == 0, f"mutation inside a checkpoint window: {state}"
    assert state["mutating"] == 0 and state["checkpointing"] == 0, state
    assert state["mut_done"] + state["ckpt_done"] + state["cancelled"] == 400, state
    assert state["ckpt_done"] > 0 and state["mut_done"] > 0 and state["cancelled"] > 0, state
    assert_idle(b)
    assert b.stats.checkpoints >= state["ckpt_done"]

    async def usable() -> None:
        await assert_usable(b)

    run(usable)


class _NoWaitCheckpoint(DataPlaneCheckpointBarrier):
    """A deliberately broken barrier: the checkpoint marks itself held but waits for no mutation in flight.

    Broken in that one respect only: it releases the way the real one does (under the lock, waking every waiter),
    so the stress run ends whatever the interleaving. (It once cleared the flag without a notify: a mutation
    queued behind it then waited forever unless another mutation happened to notify, and the test timed out.)"""

    @asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        async with self._cond:
            self._checkpoint_held = True  # the defect: no wait for active mutations
        try:
            yield
        finally:
            await asyncio.shield(self._release_checkpoint())


def test_stress_detects_a_broken_barrier() -> None:
    """The stress test's invariant check can fail: a checkpoint that does not wait is caught."""
    state = stress(0, _NoWaitCheckpoint())
    assert state["violations"] > 0, state
    assert state["mut_done"] + state["ckpt_done"] + state["cancelled"] == 400, "every task ended"


def test_draining_the_commit_waits_hands_each_one_over_once() -> None:
    async def body() -> None:
        b = DataPlaneCheckpointBarrier()
        for _ in range(3):
            async with b.mutation():
                pass
        first = b.stats.drain_mutation_waits()
        assert len(first) == 3 and all(w >= 0 for w in first)
        assert b.stats.drain_mutation_waits() == (), "a second drain sees nothing new"
        async with b.mutation():
            pass
        assert len(b.stats.drain_mutation_waits()) == 1
        assert b.stats.mutations == 4, "the counter is not drained"

    run(body)
