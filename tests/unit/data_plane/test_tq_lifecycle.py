"""``tq_lifecycle.start`` waits within its bound although TransferQueue's own waits have none: a start that has not
finished by the deadline is ``ProcessHung`` naming the units that had not started (and what was asked for is
killed), a stop is ``StopCut``, a unit whose node left is ``StorageUnitNodeGone``. TransferQueue's start is a fake
here (the real one, with a unit pinned to a node whose CPU is taken: ``tests/e2e/test_cluster_shapes.py``)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import pytest
import ray

from sc_app.data_plane import tq_lifecycle
from sc_app.data_plane.tq_placement import StorageUnitNodeGone
from sc_app.waits import Bound, ProcessHung, StopCut


@pytest.fixture
def fake_start(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``_start`` blocks until released (or raises ``error``); placement pins two units; ``_abandon`` recorded."""
    seen: dict[str, Any] = {"release": threading.Event(), "error": None, "abandoned": []}

    @contextlib.contextmanager
    def placed(pinned: list[str], held: Any) -> Any:
        pinned[:] = ["node-a-000", "node-b-000"]
        yield

    def start(conf: Any) -> None:
        seen["release"].wait(30)
        if seen["error"] is not None:
            raise seen["error"]

    monkeypatch.setattr(tq_lifecycle, "units_on_capable_nodes", placed)
    monkeypatch.setattr(tq_lifecycle, "_start", start)
    monkeypatch.setattr(tq_lifecycle, "_abandon", lambda pinned: seen["abandoned"].append(list(pinned)) or "units X")
    return seen


def test_a_start_past_its_deadline_is_a_hang_naming_the_units_and_what_it_asked_for_is_killed(
    fake_start: dict[str, Any],
) -> None:
    began = time.monotonic()
    with pytest.raises(ProcessHung) as raised:
        tq_lifecycle.start(None, Bound.within(0.5, why="set-up past run.setup_timeout_s=0.5s"))
    assert time.monotonic() - began < 5
    assert raised.value.kind == "data_plane.storage" and "units X" in str(raised.value)
    assert "run.setup_timeout_s=0.5s" in str(raised.value)
    assert fake_start["abandoned"] == [["node-a-000", "node-b-000"]]
    fake_start["release"].set()


def test_a_stop_ends_the_wait(fake_start: dict[str, Any]) -> None:
    with pytest.raises(StopCut):
        tq_lifecycle.start(None, Bound(None, lambda: True))
    assert fake_start["abandoned"], "what the start asked for is killed on a stop too"
    fake_start["release"].set()


def test_a_start_that_finishes_in_time_returns_and_kills_nothing(fake_start: dict[str, Any]) -> None:
    threading.Timer(0.3, fake_start["release"].set).start()
    tq_lifecycle.start(None, Bound.within(30))
    assert fake_start["abandoned"] == []


@pytest.mark.parametrize("error", [RuntimeError("boom"), ray.exceptions.ActorUnschedulableError("node gone")])
def test_its_errors_reach_the_caller(fake_start: dict[str, Any], error: Exception) -> None:
    fake_start["error"] = error
    fake_start["release"].set()
    expected = StorageUnitNodeGone if isinstance(error, ray.exceptions.ActorUnschedulableError) else RuntimeError
    with pytest.raises(expected) as raised:
        tq_lifecycle.start(None, Bound.within(30))
    assert "\n" not in str(raised.value) and (expected is not RuntimeError or raised.value is error)
