"""phases: the step clock's laps add up to the step, and the data-plane share counts the documented keys."""

from __future__ import annotations

import time

from sc_app.phases import ALL, CRITICAL, DATA_PLANE, StepClock, data_plane_seconds


def test_critical_phases_add_up_to_the_step() -> None:
    clock = StepClock()
    time.sleep(0.01)
    clock.lap("get")
    time.sleep(0.01)
    clock.lap("trainer")
    clock.move("trainer", "clear", 0.004)
    clock.add("trainer_get", 0.003)
    clock.add("put", 0.5)  # concurrent: not part of the sum
    time.sleep(0.005)
    total, phases = clock.finish()
    assert set(phases) == set(ALL)
    assert abs(sum(phases[k] for k in CRITICAL) - total) < 1e-9
    assert phases["get"] >= 0.01 and phases["clear"] == 0.004 and phases["controller"] >= 0.005
    assert phases["trainer"] >= 0.006


def test_move_never_charges_more_than_the_source_holds() -> None:
    clock = StepClock()
    clock.add("wait_rollouts", 0.002)
    clock.move("wait_rollouts", "clear", 5.0)
    assert clock.phases["wait_rollouts"] == 0.0 and clock.phases["clear"] == 0.002


def test_data_plane_seconds_counts_exactly_the_data_plane_keys() -> None:
    phases = dict.fromkeys(ALL, 1.0)
    assert data_plane_seconds(phases) == len(DATA_PLANE) == 5
    assert data_plane_seconds({}) == 0.0
