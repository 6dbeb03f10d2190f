"""``sc_app.waits.get``: a wait on another process ends by its result, a stop request or its deadline — never hangs.

Pure logic on fakes: ``wait`` answers like ``ray.wait`` from a table of when each call becomes ready, ``fetch`` like
``ray.get`` (raising a stored error), and a fake clock moves with every slice waited.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from sc_app import waits
from sc_app.progress import JobFailed


@dataclass
class FakeRay:
    """Calls ready at given fake times (None: never — a SIGSTOPped process); ``errors``: the call raises on get."""

    ready_at: dict[str, float | None]
    errors: dict[str, BaseException] = field(default_factory=dict)
    now: float = 0.0
    fetched: list[list[str]] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def wait(self, refs: list[str], *, num_returns: int, timeout: float) -> tuple[list[str], list[str]]:
        assert num_returns == len(refs) and 0 < timeout <= waits.SLICE_S
        ready = [r for r in refs if (t := self.ready_at[r]) is not None and t <= self.now]
        if len(ready) < num_returns:  # like ray.wait: all ready, or the slice spent
            self.now += timeout
            ready = [r for r in refs if (t := self.ready_at[r]) is not None and t <= self.now]
        return ready, [r for r in refs if r not in ready]

    def fetch(self, refs: list[str]) -> list[str]:
        self.fetched.append(list(refs))
        for r in refs:
            if r in self.errors:
                raise self.errors[r]
        return [f"value of {r}" for r in refs]

    def get(self, refs: object, bound: waits.Bound | None = None, **kw: object) -> object:
        return waits.get(
            refs, what="trainer rank 1", bound=bound, wait=self.wait, fetch=self.fetch, clock=self.clock, **kw
        )


def test_results_in_order_one_or_many() -> None:
    ray = FakeRay({"a": 2.0, "b": 0.0, "c": 1.0})
    assert ray.get(["a", "b", "c"]) == ["value of a", "value of b", "value of c"]
    assert ray.get("b") == "value of b"


def test_a_hung_process_ends_the_wait_at_its_deadline_as_a_hang() -> None:
    ray = FakeRay({"a": None})
    with pytest.raises(waits.ProcessHung) as hung:
        ray.get("a", bound=waits.Bound(until=10.0, why="run.setup_timeout_s=10s"), kind="trainer.worker")
    assert isinstance(hung.value, JobFailed), "a hang is handled like a death (in-job restore or the attempt's end)"
    assert 10.0 <= ray.now <= 10.0 + waits.SLICE_S
    assert hung.value.kind == "trainer.worker" and hung.value.names == "trainer rank 1"
    assert str(hung.value) == "trainer rank 1 did not answer for 10s (run.setup_timeout_s=10s)"


def test_a_stop_request_cuts_the_wait_within_one_slice() -> None:
    ray = FakeRay({"a": None})
    asked_at = 3.0
    with pytest.raises(waits.StopCut, match="while waiting for trainer rank 1"):
        ray.get("a", bound=waits.Bound(until=1000.0, stop=lambda: ray.now >= asked_at))
    assert asked_at <= ray.now <= asked_at + waits.SLICE_S


def test_an_error_is_raised_as_soon_as_known_not_after_the_slowest_call() -> None:
    died = RuntimeError("rank 0 died")
    ray = FakeRay({"a": 1.0, "b": None}, errors={"a": died})
    with pytest.raises(RuntimeError) as err:
        ray.get(["a", "b"], bound=waits.Bound(until=1000.0))
    assert err.value is died and ray.now <= 1.0 + waits.SLICE_S


def test_each_ready_result_is_fetched_once() -> None:
    ray = FakeRay({"a": 1.0, "b": 3.0})
    ray.get(["a", "b"])
    assert ray.fetched == [["a"], ["b"]]


def test_the_callers_bound_applies_to_every_wait_inside_it() -> None:
    ray = FakeRay({"a": None})
    with waits.bounded(waits.Bound(until=5.0, why="set-up past run.setup_timeout_s=5s")):
        with pytest.raises(waits.ProcessHung, match="setup_timeout_s=5s"):
            ray.get("a")
        with waits.bounded(waits.Bound(stop=lambda: True)), pytest.raises(waits.StopCut):
            ray.get("a")
    assert waits.current().until is None, "the bound ends with its block"


def test_a_stop_already_requested_cuts_before_the_step_that_would_not_look() -> None:
    waits.stop_before("TransferQueue was started")  # no bound, no stop: nothing happens
    with waits.bounded(waits.Bound(stop=lambda: False)):
        waits.stop_before("TransferQueue was started")
    with waits.bounded(waits.Bound(stop=lambda: True)), pytest.raises(waits.StopCut) as cut:
        waits.stop_before("TransferQueue was started")
    assert str(cut.value) == "a stop was requested before TransferQueue was started"


def test_without_a_bound_a_slow_answer_is_waited_for() -> None:
    ray = FakeRay({"a": 500.0})
    assert ray.get("a") == "value of a" and ray.now >= 500.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_heartbeat_a_controller_that_does_not_answer_is_hung() -> None:
    from sc_app.attempt.poll import Heartbeat

    clock = Clock()
    beat = Heartbeat(60.0, clock)
    beat.asked()
    clock.now = 59.0
    assert beat.silent() is None
    clock.now = 61.0
    hung = beat.silent()
    assert hung is not None and hung.kind == "controller" and "run.hang_timeout_s=60s" in str(hung)
    assert beat.silent_for() == 61.0


def test_heartbeat_answers_without_steps_are_a_hang_of_the_job_answers_with_records_are_not() -> None:
    from sc_app.attempt.poll import HANG, Heartbeat

    clock = Clock()
    beat = Heartbeat(60.0, clock)
    for t in range(0, 200, 10):  # the controller answers every 10 s; a step every 50 s
        clock.now = float(t)
        beat.asked()
        beat.answered(1 if t % 50 == 0 else 0)
        assert beat.silent() is None, t
    clock.now = 150.0 + 61.0  # the last step at 150 s; answers go on, but no step, save or fault
    beat.asked()
    beat.answered(0)
    hung = beat.silent()
    assert hung is not None and hung.kind == HANG and "a trainer rank" in hung.names


# ``in_thread``: a blocking call without a timeout of its own (TransferQueue's), on a thread, within a bound. Real
# threads and an Event standing in for the call that never returns; bounds of a fraction of a second.


def test_in_thread_returns_the_value_or_raises_the_error_of_the_call() -> None:
    assert waits.in_thread(lambda: 42, what="a call", bound=waits.Bound.within(5.0)) == 42
    with pytest.raises(KeyError, match="gone"):
        waits.in_thread(lambda: {}["gone"], what="a call", bound=waits.Bound.within(5.0))


def test_in_thread_gives_up_at_the_deadline_naming_what_give_up_says_it_waited_on() -> None:
    import threading
    import time

    never = threading.Event()
    released: list[str] = []

    def give_up() -> str:
        released.append("killed what it asked for")
        return "storage unit #1 on node b"

    began = time.monotonic()
    with pytest.raises(waits.ProcessHung) as hung:
        waits.in_thread(
            never.wait,
            what="TransferQueue's start",
            kind="data_plane.storage",
            poll_s=0.02,
            give_up=give_up,
            bound=waits.Bound.within(0.2, why="run.setup_timeout_s=0.2s"),
        )
    never.set()
    assert 0.2 <= time.monotonic() - began < 2.0
    assert released == ["killed what it asked for"]
    assert hung.value.kind == "data_plane.storage" and hung.value.names == "storage unit #1 on node b"
    assert "(run.setup_timeout_s=0.2s)" in str(hung.value)


def test_in_thread_a_hang_without_names_from_give_up_names_the_call_and_a_stop_cuts_it() -> None:
    import threading

    never = threading.Event()
    with pytest.raises(waits.ProcessHung) as hung:
        waits.in_thread(never.wait, what="clearing the data plane", poll_s=0.02, bound=waits.Bound.within(0.1))
    assert hung.value.names == "clearing the data plane"
    released: list[bool] = []
    with pytest.raises(waits.StopCut, match="while waiting for clearing the data plane"):
        waits.in_thread(
            never.wait,
            what="clearing the data plane",
            poll_s=0.02,
            give_up=lambda: released.append(True) or None,
            bound=waits.Bound(until=None, stop=lambda: True),
        )
    never.set()
    assert released == [True], "a stop releases what the call asked for too"
