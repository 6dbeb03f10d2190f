"""DataPlaneCheckpointBarrier: many data-plane mutations at once, or one checkpoint — never both.

Plain asyncio; imports neither Ray nor torch. Invariants:

* While a checkpoint window is held, no mutation is inside its ``mutation()`` block.
* A checkpoint that has asked for the window blocks *new* mutations (writer preference) and waits for the
  mutations already in progress to finish; so a steady stream of commits cannot starve a save.
* At most one checkpoint window is held or pending at a time; a second ``checkpoint()`` queues behind it.
* Cancelling a waiter (mutation or checkpoint) at any await point leaves the counters exactly as before it
  asked: nothing leaks, nobody is left blocked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass
class BarrierStats:
    """Counters a benchmark or the progress line can read; all times in seconds."""

    mutations: int = 0
    checkpoints: int = 0
    mutation_waits: list[float] = field(default_factory=list)
    checkpoint_windows: list[float] = field(default_factory=list)

    def drain_mutation_waits(self) -> tuple[float, ...]:
        """The mutation waits recorded since the previous drain (the newest ``keep_samples``), oldest first; a
        reader that drains sees every wait once."""
        waits = tuple(self.mutation_waits)
        self.mutation_waits.clear()
        return waits


class DataPlaneCheckpointBarrier:
    """Readers-writer style gate: mutations share it, a checkpoint takes it exclusively."""

    def __init__(self, *, keep_samples: int = 10_000) -> None:
        self._cond = asyncio.Condition()
        self._active_mutations = 0
        self._checkpoint_pending = False  # a checkpoint has asked; new mutations wait
        self._checkpoint_held = False
        self._keep_samples = keep_samples
        self.stats = BarrierStats()

    @property
    def active_mutations(self) -> int:
        return self._active_mutations

    @property
    def checkpoint_held(self) -> bool:
        return self._checkpoint_held

    def _record(self, samples: list[float], value: float) -> None:
        samples.append(value)
        if len(samples) > self._keep_samples:
            del samples[: len(samples) - self._keep_samples]

    @asynccontextmanager
    async def mutation(self) -> AsyncIterator[None]:
        """Hold a shared slot for one data-plane write (commit or drop).

        Waits while a checkpoint is pending or held. On exit (normal, error or cancel) the slot is released.
        """
        started = time.perf_counter()
        async with self._cond:
            await self._cond.wait_for(lambda: not self._checkpoint_pending and not self._checkpoint_held)
            self._active_mutations += 1
        self._record(self.stats.mutation_waits, time.perf_counter() - started)
        self.stats.mutations += 1
        try:
            yield
        finally:
            # Shielded so a cancellation arriving here still releases the slot.
            await asyncio.shield(self._release_mutation())

    async def _release_mutation(self) -> None:
        async with self._cond:
            self._active_mutations -= 1
            self._cond.notify_all()

    @asynccontextmanager
    async def checkpoint(self) -> AsyncIterator[None]:
        """Hold the exclusive window: no mutation runs until the block exits.

        Pre: none. Post (inside the block): ``active_mutations == 0`` and every new mutation waits.
        """
        async with self._cond:
            # One checkpoint at a time: queue behind a pending or held one.
            await self._cond.wait_for(lambda: not self._checkpoint_pending and not self._checkpoint_held)
            self._checkpoint_pending = True
            try:
                await self._cond.wait_for(lambda: self._active_mutations == 0)
            except BaseException:
                self._checkpoint_pending = False
                self._cond.notify_all()
                raise
            self._checkpoint_pending = False
            self._checkpoint_held = True
        opened = time.perf_counter()
        self.stats.checkpoints += 1
        try:
            yield
        finally:
            self._record(self.stats.checkpoint_windows, time.perf_counter() - opened)
            await asyncio.shield(self._release_checkpoint())

    async def _release_checkpoint(self) -> None:
        async with self._cond:
            self._checkpoint_held = False
            self._cond.notify_all()
