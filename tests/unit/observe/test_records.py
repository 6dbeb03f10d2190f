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
    StepRecord,
    decode,
    encode_event,
    encode_step,
)

STAMP = Stamp(t=1700000000.5, run_id="abc123", attempt=3)


def test_a_step_round_trips_and_its_line_is_plain_json() -> None:
    rec = StepRecord(
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
    )
    line = encode_step(rec, STAMP, redone=True)
    assert line.endswith("\n") and line.count("\n") == 1
    obj = json.loads(line)
    assert obj["v"] == 1 and obj["kind"] == "step" and obj["loss"] is None and obj["redone"] is True
    assert list(obj)[:7] == ["v", "kind", "t", "run_id", "attempt", "step", "redone"]
    back = decode(line)
    assert isinstance(back, LoggedStep) and back.stamp == STAMP and back.redone
    assert back.record.step == 7 and math.isnan(back.record.loss) and back.record.commit_wait_p99_s == 0.0001


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
        ('{"v":1,"kind":"step","t":1,"run_id":"a","attempt":1,"st', "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"v":2,"kind":"step"}', "schema version 2"),
        ('{"v":1,"kind":"step","t":1,"run_id":"a","attempt":1}', "malformed record"),
        ('{"v":1,"kind":"gauge","t":1,"run_id":"a","attempt":1}', "unknown kind 'gauge'"),
    ],
)
def test_unreadable_lines_are_refused_with_the_reason(line: str, problem: str) -> None:
    with pytest.raises(RecordError, match=problem):
        decode(line)
