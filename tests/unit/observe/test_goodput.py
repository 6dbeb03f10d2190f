"""observe.goodput: where a run's wall time went, from a run log written line by line as the driver writes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sc_app.observe.goodput import BUCKETS, ledger
from sc_app.observe.reader import read_history
from sc_app.observe.records import Event, Stamp, StepMetrics, encode_event, encode_step


class Log:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: list[str] = []

    def step(self, attempt: int, t: float, step: int, seconds: float, *, redone: bool = False) -> None:
        rec = StepMetrics(step, 0.5, 0.0, 1.0, -0.1, 1.0, 16, seconds, step)
        self.lines.append(encode_step(rec, Stamp(t, f"run{attempt}", attempt), redone=redone))

    def event(self, attempt: int, t: float, name: str, step: int, **data: Any) -> None:
        self.lines.append(encode_event(Event(name, step, data), Stamp(t, f"run{attempt}", attempt)))  # type: ignore[arg-type]

    def read(self) -> Any:
        self.path.write_text("".join(self.lines))
        return read_history(self.path)


def fault(**kw: Any) -> dict[str, Any]:
    return {
        "fault": "data_plane.put",
        "outcome": "recovered",
        "attempts": 2,
        "detection_s": 0.01,
        "recovery_s": 0.25,
        "steps_redone": 0,
        "rollouts_regenerated": 0,
        "prompts_lost": 0,
        "prompts_duplicated": 0,
        **kw,
    }


def killed_and_resumed(tmp_path: Path) -> Log:
    """Attempt 1 trains steps 1-4 (a save at 2, a recovered fault), is killed; attempt 2 resumes step_2, redoes 3-4."""
    log = Log(tmp_path / "metrics.jsonl")
    log.event(1, 100.0, "start", 0, decision="fresh")
    for k, step in enumerate((1, 2, 3, 4)):
        log.step(1, 110.0 + 2 * k, step, 2.0)
        if step == 2:
            log.event(1, 112.1, "save", 2, bundle="step_2", seconds=3.0, paused_seconds=0.5, window_seconds=0.001)
            log.event(1, 113.0, "fault", 2, **fault())
    log.event(2, 130.0, "start", 2, decision="resume")
    log.event(2, 130.0, "resume", 2, bundle="step_2")
    log.step(2, 130.5, 2, 2.0)  # a step the bundle kept, logged for attempt 1 (``recovered``): not attempt 2's work
    for k, step in enumerate((3, 4, 5)):
        log.step(2, 140.0 + 2 * k, step, 2.0, redone=step < 5)
    log.event(2, 145.0, "exit", 5, code=0, final_step=5)
    return log


def test_every_second_of_a_killed_and_resumed_run_is_placed(tmp_path: Path) -> None:
    led = ledger(killed_and_resumed(tmp_path).read())
    a1, a2 = led.attempts
    assert a1.seconds == pytest.approx(
        {
            **dict.fromkeys(BUCKETS, 0.0),
            "startup": 8.0,
            "training": 3.25,
            "saves": 0.5,
            "recoveries": 0.25,
            "redone": 4.0,
        }
    )
    assert a1.wall_s == pytest.approx(16.0) and not a1.resumed
    assert a2.seconds == pytest.approx({**dict.fromkeys(BUCKETS, 0.0), "restore": 8.0, "training": 6.0, "other": 1.0})
    assert a2.resumed and a2.wall_s == pytest.approx(15.0)
    assert led.seconds["between_attempts"] == pytest.approx(14.0)
    assert led.wall_s == pytest.approx(45.0)
    assert led.goodput == pytest.approx(9.25 / 45.0)
    assert sum(a.wall_s for a in led.attempts) + led.seconds["between_attempts"] == pytest.approx(led.wall_s)
    assert led.job_retries == 1


def test_fault_costs_are_summed_and_named(tmp_path: Path) -> None:
    log = killed_and_resumed(tmp_path)
    log.event(2, 141.0, "fault", 3, **fault(fault="data_plane.clear", recovery_s=0.75, detection_s=0.2))
    led = ledger(log.read())
    f = led.faults
    assert f.count == 2 and f.by_kind == {"data_plane.clear recovered": 1, "data_plane.put recovered": 1}
    assert f.recovery_s_median == pytest.approx(0.5) and f.recovery_s_max == 0.75 and f.detection_s_max == 0.2
    assert f.prompts_lost == f.prompts_duplicated == f.steps_redone == 0
    assert led.attempts[1].seconds["recoveries"] == 0.75
    line = led.line()
    assert line.startswith("goodput ") and "in-job recoveries 1.0s" in line and "prompts lost 0, duplicated 0" in line
    assert led.as_event()["faults"] == 2 and set(led.as_event()["seconds"]) == set(BUCKETS)


def test_a_fault_free_run_is_mostly_training(tmp_path: Path) -> None:
    log = Log(tmp_path / "metrics.jsonl")
    log.event(1, 0.0, "start", 0, decision="fresh")
    for step in range(1, 11):
        log.step(1, 5.0 + step, step, 1.0)
    log.event(1, 15.5, "exit", 10, code=0)
    led = ledger(log.read())
    assert led.goodput == pytest.approx(10 / 15.5)
    assert led.seconds["startup"] == pytest.approx(5.0) and led.seconds["other"] == pytest.approx(0.5)
    assert led.faults.count == 0 and led.job_retries == 0


def test_an_attempt_that_never_trained_is_all_start_up(tmp_path: Path) -> None:
    log = Log(tmp_path / "metrics.jsonl")
    log.event(1, 0.0, "start", 0, decision="fresh")
    log.event(1, 4.0, "exit", 0, code=1)
    led = ledger(log.read())
    assert led.seconds["startup"] == 4.0 and led.goodput == 0.0
    assert ledger(Log(tmp_path / "empty.jsonl").read()).line() == "goodput: nothing measured yet"


def test_the_report_shows_the_ledger_as_a_table_and_a_plot(tmp_path: Path) -> None:
    from sc_app.observe.report import write_report

    history = killed_and_resumed(tmp_path).read()
    led = ledger(history)
    summary = write_report(history, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Goodput" in md and led.line() in md
    assert "| **run** | **45.0** | **20.6%** |" in md
    assert "| data_plane.put | recovered | 1 |" in md and "prompts lost 0, prompts duplicated 0" in md
    assert summary.goodput["goodput"] == pytest.approx(led.goodput)
    assert (tmp_path / "report" / "goodput.png").stat().st_size > 0

    from sc_app.observe.goodput_report import figure

    plotted = {r.get_gid(): r.get_height() for r in figure(led).axes[0].patches}
    want = {f"{b}@attempt {a.attempt}": v for a in led.attempts for b, v in a.seconds.items() if v > 0}
    want["between_attempts@between"] = led.seconds["between_attempts"]
    assert plotted == pytest.approx(want)
