"""The run log on real files: appends across attempts, redone steps, torn lines, a volume that stalls or fails.

No Ray here: the writer is plain threads and files. A stalled volume is a named pipe nobody reads (``open`` and
``write`` block in the kernel exactly as on a hung mount); a full disk is ``/dev/full`` (every write gets ENOSPC
from the kernel). TensorBoard files are read back with TensorBoard's own ``EventAccumulator``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sc_app.observe.reader import RunLogMissing, read_history
from sc_app.observe.records import LOG_FILE, Event, StepMetrics
from sc_app.observe.runlog import EVENT_RESERVE, RunLogOptions, RunLogWriter, scan_prior


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def rec(step: int, reward: float | None = None) -> StepMetrics:
    r = step / 100 if reward is None else reward
    return StepMetrics(
        step=step,
        reward_mean=r,
        reward_min=r - 0.1,
        reward_max=r + 0.1,
        loss=-r,
        staleness=1.0,
        rows_held=64,
        step_seconds=0.05,
        weights_version=step,
    )


def attempt(
    log_dir: Path,
    steps: range,
    *,
    run_id: str,
    n: int | None,
    start_step: int,
    reward: float | None = None,
    exit_code: int | None = 0,
    tensorboard: bool = False,
) -> RunLogWriter:
    """One attempt: start (+ resume) event, the steps with a save every 2, exit (unless ``exit_code`` is None)."""
    w = RunLogWriter(
        RunLogOptions(log_dir, run_id=run_id, attempt=n, start_step=start_step, tensorboard=tensorboard)
    ).start()
    w.event(Event("start", start_step, {"decision": "resume" if start_step else "fresh"}))
    if start_step:
        w.event(Event("resume", start_step, {"bundle": f"step_{start_step}", "reason": "newest verified"}))
    for s in steps:
        assert w.step(rec(s, reward))
        if s % 2 == 0:
            w.event(Event("save", s, {"bundle": f"step_{s}", "seconds": 0.1, "window_seconds": 0.002, "bytes": 10}))
    final = Event("exit", steps[-1], {"code": exit_code, "final_step": steps[-1]}) if exit_code is not None else None
    result = w.close(final=final)
    assert result.unwritten == 0 and result.dropped.total == 0
    return w


def test_a_resumed_attempt_appends_and_marks_the_steps_it_redoes(tmp_path: Path) -> None:
    attempt(tmp_path, range(1, 8), run_id="a1", n=1, start_step=0, exit_code=None)  # killed after step 7
    attempt(tmp_path, range(5, 11), run_id="a2", n=2, start_step=4, reward=0.9)  # resumed from step_4

    h = read_history(tmp_path)
    assert h.skipped == 0
    second = [s for s in h.steps if s.stamp.attempt == 2]
    assert {s.step: s.redone for s in second} == {5: True, 6: True, 7: True, 8: False, 9: False, 10: False}
    assert not any(s.redone for s in h.steps if s.stamp.attempt == 1)
    eff = h.effective_steps()
    assert [s.step for s in eff] == list(range(1, 11))
    assert [s.stamp.attempt for s in eff] == [1] * 4 + [2] * 6
    assert all(s.record.reward_mean == 0.9 for s in eff[4:])
    starts = h.events_named("start")
    assert [(e.stamp.attempt, e.data["high_water"]) for e in starts] == [(1, 0), (2, 7)]
    assert [(a.attempt, a.start_step, a.resumed_from, a.exit_code) for a in h.attempts()] == [
        (1, 0, None, None),
        (2, 4, "step_4", 0),
    ]
    assert [e.step for e in h.saves()] == [2, 4, 6, 6, 8, 10]
    (exit_ev,) = h.events_named("exit")
    assert exit_ev.data["dropped"] == {"steps": 0, "events": 0, "write_failed": 0}
    assert h.missing_steps() == []


def test_the_high_water_mark_survives_a_short_attempt_in_between(tmp_path: Path) -> None:
    attempt(tmp_path, range(1, 14), run_id="a1", n=1, start_step=0, exit_code=None)  # logged up to 13
    attempt(tmp_path, range(11, 13), run_id="a2", n=2, start_step=10, exit_code=None)  # killed at 12
    assert scan_prior(tmp_path / LOG_FILE).high_water == 13
    attempt(tmp_path, range(11, 16), run_id="a3", n=3, start_step=10)
    third = {s.step: s.redone for s in read_history(tmp_path).steps if s.stamp.attempt == 3}
    assert third == {11: True, 12: True, 13: True, 14: False, 15: False}


def test_attempt_number_follows_the_log_when_there_is_no_lease(tmp_path: Path) -> None:
    attempt(tmp_path, range(1, 3), run_id="a1", n=None, start_step=0)
    attempt(tmp_path, range(3, 5), run_id="a2", n=None, start_step=2)
    assert [a.attempt for a in read_history(tmp_path).attempts()] == [1, 2]


def test_a_line_torn_by_a_kill_stays_one_skipped_line(tmp_path: Path) -> None:
    attempt(tmp_path, range(1, 4), run_id="a1", n=1, start_step=0, exit_code=None)
    with open(tmp_path / LOG_FILE, "a") as fh:
        fh.write('{"v":1,"kind":"step","t":1.0,"run_id":"a1","attempt":1,"step":4,"red')  # SIGKILL mid-write
    attempt(tmp_path, range(3, 6), run_id="a2", n=2, start_step=2)
    h = read_history(tmp_path)
    assert h.skipped == 1
    assert [s.step for s in h.effective_steps()] == [1, 2, 3, 4, 5]
    # step 4 was trained before the kill (its line is what got torn): training it again is a redo
    assert {s.step: s.redone for s in h.steps if s.stamp.attempt == 2} == {3: True, 4: True, 5: False}


def test_a_stalled_volume_never_blocks_the_caller_and_drops_are_counted(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOG_FILE)  # nobody reads it yet: the writer thread blocks in open(), as on a hung mount
    capacity = 10
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="slow", attempt=1, start_step=0, capacity=capacity)).start()
    assert w.step(rec(1))
    wait_until(lambda: w.buffered == 0)  # the thread took step 1 and is now stuck opening the pipe
    emitted = 200
    accepted = 1 + sum(w.step(rec(s)) for s in range(2, emitted + 1))  # would hang here if step() waited for I/O
    assert accepted == 1 + capacity
    assert w.dropped.steps == emitted - accepted
    # events keep a reserve of their own while steps are being dropped
    assert w.event(Event("save", 200, {"bundle": "step_200", "seconds": 1.0}))
    assert not w.step(rec(201))
    assert sum(w.event(Event("prune", 200, {"removed": []})) for _ in range(EVENT_RESERVE + 5)) < EVENT_RESERVE + 5
    assert not w.event(Event("exit", 200, {"code": 0}))  # the reserve is full ...

    lines: list[str] = []

    def drain() -> None:
        with open(tmp_path / LOG_FILE) as fh:
            lines.extend(fh.read().splitlines())

    reader = threading.Thread(target=drain)
    reader.start()  # the volume comes back (the writer drains from here on: the full reserve is checked above)
    result = w.close(timeout=60, final=Event("exit", 200, {"code": 0}))  # ... but close() always takes the exit
    reader.join(60)
    assert result.unwritten == 0
    objs = [json.loads(line) for line in lines]
    steps = [o["step"] for o in objs if o["kind"] == "step"]
    assert len(steps) == accepted
    notes = [o for o in objs if o.get("event") == "dropped"]
    assert sum(n["steps"] for n in notes) == result.dropped.steps == emitted - accepted + 1
    assert sum(n["events"] for n in notes) == result.dropped.events > 0
    assert "slower than training" in notes[0]["reason"]
    (exit_ev,) = [o for o in objs if o.get("event") == "exit"]
    assert exit_ev["dropped"]["steps"] == result.dropped.steps
    assert [o for o in objs if o.get("event") == "save"], "the event sent while steps were dropped was kept"


def test_a_full_disk_loses_records_counted_and_never_raises(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("/dev/full is not available on this system")
    (tmp_path / LOG_FILE).symlink_to("/dev/full")  # every write: ENOSPC from the kernel
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="full", attempt=1, start_step=0)).start()
    for s in range(1, 21):
        w.step(rec(s))
    result = w.close(timeout=60, final=Event("exit", 20, {"code": 0}))
    assert result.unwritten == 0
    assert result.dropped.write_failed == 21
    assert result.written == 0


def test_an_unwritable_log_dir_is_counted_not_raised(tmp_path: Path) -> None:
    (tmp_path / LOG_FILE).mkdir()  # metrics.jsonl is a directory: open() fails every time
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="bad", attempt=1, start_step=0)).start()
    w.step(rec(1))
    w.step(rec(2))
    result = w.close(timeout=60)
    assert result.dropped.write_failed == 2


def test_reading_a_missing_log_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(RunLogMissing, match=str(tmp_path / LOG_FILE)):
        read_history(tmp_path)


def test_tensorboard_files_read_back_once_per_step_after_a_resume(tmp_path: Path) -> None:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    attempt(tmp_path, range(1, 8), run_id="a1", n=1, start_step=0, exit_code=None, tensorboard=True)
    attempt(tmp_path, range(5, 11), run_id="a2", n=2, start_step=4, reward=0.9, tensorboard=True)
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 2

    acc = ea_mod.EventAccumulator(str(tmp_path))
    acc.Reload()
    reward = [(e.step, round(e.value, 4)) for e in acc.Scalars("train/reward_mean")]
    assert reward == [(s, round(s / 100, 4)) for s in range(1, 5)] + [(s, 0.9) for s in range(5, 11)]
    assert [e.step for e in acc.Scalars("train/rows_in_tq")] == list(range(1, 11))
    assert [e.step for e in acc.Scalars("save/seconds")] == [2, 4, 6, 8, 10]
    assert [(e.step, e.value) for e in acc.Scalars("run/attempt")] == [(0, 1.0), (4, 2.0)]


def test_an_attempt_that_trains_no_step_writes_no_tensorboard_file(tmp_path: Path) -> None:
    """TensorBoard's writer is made at the first step (its import costs seconds): a refused or stopped-early attempt
    logs its events to metrics.jsonl only, and never waits on that import."""
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="r", attempt=1, start_step=0, tensorboard=True)).start()
    w.event(Event("start", 0, {"decision": "fresh"}))
    result = w.close(final=Event("exit", 0, {"code": 2, "final_step": 0}))
    assert result.unwritten == 0 and result.written == 2
    assert [json.loads(line)["event"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        "start",
        "exit",
    ]
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_jsonl_lines_never_wait_for_tensorboard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorBoard's writer (a torch import: seconds of CPU, longer than a step on a loaded node) is made in a
    thread of its own: every step queued meanwhile reaches metrics.jsonl, so a SIGKILL during that import loses no
    line (the CI failure: steps 5-9 were held behind it when the head was killed, and the resumed bundle covered only
    6-10). Once the writer exists, the points held for it are written."""
    from sc_app.observe import tensorboard_writer

    made = threading.Event()
    release = threading.Event()
    points: list[tuple[str, int]] = []

    class SlowImport:
        def __init__(self, log_dir: Path, *, purge_step: int | None) -> None:
            made.set()
            assert release.wait(60)

        def step(self, logged: object) -> None:
            points.append(("step", logged.step))  # type: ignore[attr-defined]

        def event(self, logged: object) -> None:
            points.append(("event", logged.step))  # type: ignore[attr-defined]

        def flush(self) -> None: ...

        def close(self) -> None: ...

    monkeypatch.setattr(tensorboard_writer, "ScalarWriter", SlowImport)
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="r", attempt=1, start_step=0, tensorboard=True)).start()
    w.event(Event("start", 0, {"decision": "fresh"}))
    w.step(rec(1))
    assert made.wait(30)
    for s in range(2, 10):
        w.step(rec(s))
    wait_until(lambda: len(read_history(tmp_path).steps) == 9)
    assert [s.step for s in read_history(tmp_path).steps] == list(range(1, 10))
    assert points == []
    release.set()
    result = w.close()
    assert result.unwritten == 0
    assert points == [("event", 0), *(("step", s) for s in range(1, 10))]


def test_a_tensorboard_writer_still_importing_at_close_never_holds_the_jsonl_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sc_app.observe import tensorboard_writer

    made = threading.Event()
    release = threading.Event()

    class Stuck:
        def __init__(self, log_dir: Path, *, purge_step: int | None) -> None:
            made.set()
            release.wait(60)

    monkeypatch.setattr(tensorboard_writer, "ScalarWriter", Stuck)
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="r", attempt=1, start_step=0, tensorboard=True)).start()
    w.step(rec(1))
    assert made.wait(30)
    result = w.close(timeout=0.5, final=Event("exit", 1, {"code": 0, "final_step": 1}))
    release.set()
    assert result.unwritten == 0 and result.written == 2
    assert [s.step for s in read_history(tmp_path).steps] == [1]
