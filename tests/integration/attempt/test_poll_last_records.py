"""``sc_app.attempt.poll.drive`` on a real local Ray: a fault that ends the drive never drops the controller's records
that no poll had collected yet (a save committed an instant before a trainer rank died: the run log and the console
must still show it). A stand-in controller actor records on request; ``watch`` reports the death right after it
recorded, so no regular poll can have collected that record."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sc_app.attempt import poll  # noqa: E402
from sc_app.attempt.actor_watch import TRAINER, ActorsDied, DeadActor  # noqa: E402
from sc_app.progress import ProgressRecord, SaveRecord  # noqa: E402


@ray.remote(num_cpus=0)
class Controller:
    """Runs until killed; ``progress`` answers like ``SingleControllerActor.progress``, or never (``hang``)."""

    def __init__(self) -> None:
        self.records: list[ProgressRecord] = []
        self.hangs = False

    async def run(self) -> None:
        await asyncio.sleep(3600)

    async def progress(self, since: int) -> list[ProgressRecord]:
        while self.hangs:
            await asyncio.sleep(3600)
        return self.records[since:]

    async def record(self, step: int, hang_after: bool = False) -> None:
        self.records.append(SaveRecord(step, f"step_{step}", 1.0, 0.01, 0.001, 8, 1024))
        self.hangs = hang_after


def _dies_after_a_save(actor: Any, got: list[int], died: list[float], hang_after: bool = False) -> Any:
    """A ``watch`` that has the controller record step 4's save, lets the polls collect it (``got``: what the drive
    handed on so far; a loaded machine may take many polls), then has it record step 6's and reports a dead rank in
    the same call (its time in ``died``): no regular poll can have collected step 6."""
    calls, deadline = 0, time.monotonic() + 120

    def watch() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            ray.get(actor.record.remote(4))
        elif got == [4]:
            ray.get(actor.record.remote(6, hang_after))
            died.append(time.monotonic())
            raise ActorsDied([DeadActor(TRAINER, "trainer rank 0", "n1", True, 1.0)])
        assert time.monotonic() < deadline, f"no poll collected step 4's record in 120 s (got {got})"

    return watch


def _drive(actor: Any, hang_after: bool = False) -> tuple[list[int], float]:
    """What the drive handed on, and the seconds from the death to the drive's end."""
    got: list[int] = []
    died: list[float] = []
    watch = _dies_after_a_save(actor, got, died, hang_after)
    with pytest.raises(ActorsDied, match="trainer rank 0 died"):
        poll.drive(
            actor,
            emergency_budget_s=10,
            on_progress=lambda r: got.append(r.step),
            stop_requested=lambda: False,
            poll_seconds=0.05,
            watch=watch,
        )
    return got, time.monotonic() - died[0]


def test_a_save_recorded_just_before_a_death_is_handed_over_before_the_fault(local_ray: Any) -> None:
    actor = Controller.remote()
    try:
        got, _ = _drive(actor)
        assert got == [4, 6], "every record in order, the one no poll had collected too, each once"
    finally:
        ray.kill(actor)


def test_a_controller_that_does_not_answer_costs_the_fault_at_most_the_bound(local_ray: Any) -> None:
    actor = Controller.remote()
    try:
        got, seconds = _drive(actor, hang_after=True)
        assert got == [4], "a hung controller has nothing to give; the fault goes on as it is"
        assert seconds < poll.LAST_RECORDS_S + 5.0, seconds  # 5 s: slack for a loaded machine
    finally:
        ray.kill(actor)
