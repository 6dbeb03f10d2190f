"""Deadline-aware emergency saves (issue 19, finding 5): the pure decision and the slow-save warning."""

from __future__ import annotations

import pytest

from sc_app.checkpoint.emergency import SAFETY, plan_emergency, slow_save
from sc_app.config.app import AppConfig, ConfigError, load_config


@pytest.mark.parametrize(("recent", "left", "start"), [
    ([], 30.0, True),  # nothing timed yet: try
    ([4.0], 30.0, True),
    ([4.0], 4.0 * SAFETY, True),  # exactly fits
    ([4.0], 4.0 * SAFETY - 0.01, False),
    ([40.0, 2.0, 2.0, 2.0], 5.0, True),  # only the newest three count
    ([2.0, 40.0, 2.0], 5.0, False),  # the slowest of them does
    ([2.0], 0.0, False),
    ([], -1.0, False),  # out of time before any history
])
def test_an_emergency_bundle_starts_only_when_it_can_finish(recent, left, start) -> None:
    plan = plan_emergency(recent, left, newest_bundle="step_40")
    assert plan.start is start
    if not start:
        assert plan.line.startswith("emergency bundle skipped: ")
        assert "the newest bundle step_40 stays the resume point" in plan.line


def test_the_skip_line_says_what_it_went_by() -> None:
    plan = plan_emergency([12.0, 30.0], 15.0, newest_bundle=None)
    assert plan.line == ("emergency bundle skipped: recent saves took up to 30.0s and only 15.0s are left of "
                         "checkpoint.emergency_budget_s; there is no bundle yet (checkpoint.save_period is the "
                         "protection here)")
    assert plan.estimate_s == pytest.approx(30.0 * SAFETY)


def test_slow_saves_are_warned_about_against_the_preemption_notice() -> None:
    assert slow_save(10, 20.0, None) is None
    assert slow_save(10, 14.0, 15.0) is None
    line = slow_save(10, 95.5, 30.0)
    assert line is not None and line.startswith("save of step_10 took 95.5s, longer than "
                                                "checkpoint.preemption_notice_s=30s")
    assert "checkpoint.save_period is your real protection" in line


def test_preemption_notice_is_a_config_key() -> None:
    assert AppConfig().checkpoint.preemption_notice_s is None
    cfg = load_config(None, ["checkpoint.preemption_notice_s=15"])
    assert cfg.checkpoint.preemption_notice_s == 15
    with pytest.raises(ConfigError, match="preemption_notice_s"):
        load_config(None, ["checkpoint.preemption_notice_s=0"])


def test_how_long_a_stop_waits_for_the_save_in_flight() -> None:
    """A save of an older step: until only the emergency bundle's estimate is left (half the time with no history);
    a save of the step reached: all of it but the end's margin; nothing when no time is left."""
    from sc_app.checkpoint.emergency import END_MARGIN_S, in_flight_wait

    assert in_flight_wait([4.0, 2.0], 20.0, same_step=False) == pytest.approx(20.0 - 4.0 * SAFETY)
    assert in_flight_wait([30.0], 20.0, same_step=False) == 0.0, "no emergency could fit: abandon at once"
    assert in_flight_wait([], 20.0, same_step=False) == 10.0
    assert in_flight_wait([4.0], 20.0, same_step=True) == 20.0 - END_MARGIN_S
    assert in_flight_wait([4.0], 1.0, same_step=True) == pytest.approx(0.8)
    assert in_flight_wait([4.0], -1.0, same_step=True) == 0.0
