"""The run log's line format: round trips, JSON that stays valid, refusals that name the problem. Pure."""

from __future__ import annotations

import json
import math

import pytest

from sc_app.observe.records import (
    EVENT_NAMES,
    Event,
    LoggedEvent,
    LoggedStep,
    RecordError,
    Stamp,
    StepMetrics,
    decode,
    encode_event,
    encode_step,
    nearest_rank,
)
from sc_app.progress import StepRecord

STAMP = Stamp(t=1700000000.5, run_id="abc123", attempt=3)


def test_a_step_round_trips_and_its_line_is_plain_json() -> None:
    rec = StepMetrics(
        step=7,
        reward_mean=0.5,
        reward_min=0.0,
        reward_max=1.0,
        loss=math.nan,  # a diverged loss stays valid JSON: null, read back as NaN
        staleness=1.0,
        rows_held=64,
        step_seconds=0.08,
        weights_version=7,
        commit_wait_p99_s=0.0001,
        phase_seconds={"trainer": 0.05, "put": 0.01},
    )
    line = encode_step(rec, STAMP, redone=True)
    assert line.endswith("\n") and line.count("\n") == 1
    obj = json.loads(line)
    assert obj["v"] == 1 and obj["kind"] == "step" and obj["loss"] is None and obj["redone"] is True
    assert list(obj)[:7] == ["v", "kind", "t", "run_id", "attempt", "step", "redone"]
    back = decode(line)
    assert isinstance(back, LoggedStep) and back.stamp == STAMP and back.redone
    assert back.record.step == 7 and math.isnan(back.record.loss) and back.record.commit_wait_p99_s == 0.0001
    assert back.record.phase_seconds == {"trainer": 0.05, "put": 0.01}


def test_an_event_round_trips() -> None:
    ev = Event("save", 10, {"bundle": "step_10", "seconds": 0.25, "bytes": 4096, "pruned": ["step_4"]})
    back = decode(encode_event(ev, STAMP))
    assert isinstance(back, LoggedEvent) and back.stamp == STAMP
    assert back.name == "save" and back.step == 10 and dict(back.data) == dict(ev.data)


def test_events_are_named_from_one_list_and_cannot_shadow_the_head() -> None:
    assert {"start", "resume", "save", "emergency_save", "save_failed", "exit", "dropped"} <= set(EVENT_NAMES)
    with pytest.raises(ValueError, match="unknown run-log event 'saved'"):
        Event("saved")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\['attempt', 'step'\] shadow"):
        Event("exit", 3, {"step": 4, "attempt": 1})


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('{"v":1,"kind":"step","t":1,"run_id":"a","attempt":1,"st', "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"v":2,"kind":"step"}', "schema version 2"),
        ('{"v":1,"kind":"step","t":1,"run_id":"a","attempt":1}', "malformed record"),
        ('{"v":1,"kind":"gauge","t":1,"run_id":"a","attempt":1}', "unknown kind 'gauge'"),
    ],
)
def test_unreadable_lines_are_refused_with_the_reason(line: str, problem: str) -> None:
    with pytest.raises(RecordError, match=problem):
        decode(line)


def test_step_figures_summarise_the_controllers_record() -> None:
    waits = tuple(0.001 * n for n in range(1, 201))  # 200 commit waits: the p99 is the 198th smallest
    rec = StepRecord(
        9, 0.25, -0.5, 1.0, 48, 0.3, reward_min=0.0, reward_max=0.75, weights_version=9, commit_waits=waits,
        phase_seconds={"generation": 0.2, "get": 0.01},
    )
    m = StepMetrics.of(rec)
    assert (m.step, m.reward_mean, m.reward_min, m.reward_max, m.loss) == (9, 0.25, 0.0, 0.75, -0.5)
    assert (m.staleness, m.rows_held, m.step_seconds, m.weights_version) == (1.0, 48, 0.3, 9)
    assert m.commit_wait_p99_s == pytest.approx(0.198) and m.commit_wait_max_s == pytest.approx(0.2)
    assert m.phase_seconds == {"generation": 0.2, "get": 0.01}
    bare = StepMetrics.of(StepRecord(1, 0.5, 0.0, 0.0, 0, 0.1))  # a record without the optional figures
    assert bare.commit_wait_p99_s is None and bare.commit_wait_max_s is None and bare.weights_version is None
    back = decode(encode_step(bare, STAMP, redone=False))
    assert isinstance(back, LoggedStep) and back.record.weights_version is None and math.isnan(back.record.reward_min)
    assert bare.phase_seconds is None and back.record.phase_seconds is None


def test_nearest_rank_is_an_observed_value() -> None:
    assert nearest_rank([], 0.99) is None
    assert nearest_rank([0.5], 0.99) == 0.5
    assert nearest_rank([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert nearest_rank([float(n) for n in range(1, 101)], 0.99) == 99.0
