"""``sc-app report``'s plots and summary against the run log they come from: the data, not the pixels.

The log is written by the real writer (two attempts: the second resumes from an older bundle, redoes steps, fails
one save and cuts an emergency bundle); every plotted series is compared with the log's effective series.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.figure import Figure

from sc_app.observe.reader import RunHistory, read_history
from sc_app.observe.records import Event, StepMetrics
from sc_app.observe.report import FIGURES, SUMMARY_FILE, build_figures, summarize, summary_json, write_report
from sc_app.observe.runlog import RunLogOptions, RunLogWriter


def rec(step: int, attempt: int) -> StepMetrics:
    r = min(1.0, step / 20) + 0.01 * attempt
    return StepMetrics(step, r, r - 0.2, r + 0.2, -r / 10, 1.0, 64 - step % 8, 0.05 + step / 1000, step)


def save(step: int, name: str = "save") -> Event:
    data = {"bundle": f"step_{step}", "seconds": 0.1 * step, "paused_seconds": 0.001 * step, "window_seconds": 0.002}
    return Event(name, step, {**data, "bytes": 1000 * step})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> RunHistory:
    d = tmp_path_factory.mktemp("logs")
    w = RunLogWriter(RunLogOptions(d, run_id="r1", attempt=1, start_step=0, tensorboard=False)).start()
    w.event(Event("start", 0, {"decision": "fresh"}))
    for s in range(1, 13):
        w.step(rec(s, 1))
        if s % 4 == 0:
            w.event(save(s))
    w.close()  # SIGKILLed after step 12: no exit event
    w = RunLogWriter(RunLogOptions(d, run_id="r2", attempt=2, start_step=8, tensorboard=False)).start()
    w.event(Event("start", 8, {"decision": "resume"}))
    w.event(Event("resume", 8, {"bundle": "step_8", "reason": "newest verified bundle"}))
    for s in range(9, 19):
        w.step(rec(s, 2))
        if s == 12:
            w.event(Event("save_failed", 12, {"error": "No space left on device"}))
        if s == 16:
            w.event(save(16))
    w.event(Event("stop_requested", 18))
    w.event(save(18, "emergency_save"))
    w.close(final=Event("exit", 18, {"code": 143, "final_step": 18}))
    return read_history(d)


def artists(fig: Figure, gid: str) -> list[Any]:
    found = fig.findobj(lambda a: a.get_gid() == gid)
    assert found, f"no artist with gid {gid!r}"
    return found


def line_xy(fig: Figure, gid: str) -> tuple[list[float], list[float]]:
    (line,) = artists(fig, gid)
    return [float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()]


def test_the_plotted_series_are_the_logs_effective_series(history: RunHistory) -> None:
    eff = history.effective_steps()
    steps = [float(s.step) for s in eff]
    assert steps == [float(n) for n in range(1, 19)]
    assert [s.stamp.attempt for s in eff] == [1] * 8 + [2] * 10  # attempt 2 redid 9-12
    figs = build_figures(history)
    assert set(figs) == set(FIGURES)

    rl = figs["reward_loss"]
    assert line_xy(rl, "reward_mean") == (steps, [s.record.reward_mean for s in eff])
    assert line_xy(rl, "loss") == (steps, [s.record.loss for s in eff])
    (band,) = artists(rl, "reward_range")
    verts = {(round(x, 6), round(y, 6)) for x, y in band.get_paths()[0].vertices}
    for s in eff:
        assert (s.step, round(s.record.reward_min, 6)) in verts and (s.step, round(s.record.reward_max, 6)) in verts
    resumes = artists(rl, "resume")
    assert len(resumes) == 2 and all(list(r.get_xdata()) == [8, 8] for r in resumes)  # on both axes
    reward_at = {s.step: s.record.reward_mean for s in eff}
    for scatter in artists(rl, "saves"):
        xs = [int(x) for x in scatter.get_offsets()[:, 0]]
        assert xs == [4, 8, 12, 16]  # every published periodic bundle, the one attempt 1 cut at 12 included
    top_saves = artists(rl, "saves")[0]
    np.testing.assert_allclose(top_saves.get_offsets()[:, 1], [reward_at[s] for s in (4, 8, 12, 16)])
    (em,) = [a for a in artists(rl, "emergency_saves") if a.axes is rl.axes[0]]
    assert [tuple(p) for p in em.get_offsets()] == [(18, reward_at[18])]

    st = figs["step_time"]
    assert line_xy(st, "step_seconds") == (steps, [s.record.step_seconds for s in eff])
    assert [list(r.get_xdata()) for r in artists(st, "resume")] == [[8, 8]]

    sv = figs["saves"]
    saves = history.saves()
    xs = [float(e.step or 0) for e in saves]
    assert xs == [4.0, 8.0, 12.0, 16.0, 18.0]
    assert line_xy(sv, "save_seconds") == (xs, [e.data["seconds"] for e in saves])
    assert line_xy(sv, "window_ms") == (xs, [1000 * e.data["window_seconds"] for e in saves])
    assert line_xy(sv, "paused_ms") == (xs, [1000 * e.data["paused_seconds"] for e in saves])
    (em,) = artists(sv, "emergency_save_seconds")
    assert [tuple(p) for p in em.get_offsets()] == [(18, pytest.approx(1.8))]


def test_the_summary_counts_what_the_log_holds(history: RunHistory) -> None:
    s = summarize(history)
    assert (s.first_step, s.last_step, s.steps_logged, s.redone_lines, s.missing_steps) == (1, 18, 18, 4, [])
    assert (s.saves, s.emergency_saves, s.failed_saves) == (5, 1, 1)
    assert s.save_seconds_max == pytest.approx(1.8) and s.save_paused_ms_max == pytest.approx(18.0)
    assert s.bundle_bytes_last == 18000
    assert [(a["attempt"], a["start_step"], a["resumed_from"], a["exit_code"]) for a in s.attempts] == [
        (1, 0, None, None),
        (2, 8, "step_8", 143),
    ]
    assert s.resumes == [{"attempt": 2, "step": 8, "bundle": "step_8", "reason": "newest verified bundle"}]
    eff = history.effective_steps()
    assert s.reward_first == pytest.approx(sum(x.record.reward_mean for x in eff[:10]) / 10)


def test_write_report_writes_pngs_and_markdown(history: RunHistory, tmp_path: Path) -> None:
    s = write_report(history, tmp_path / "out")
    for name in FIGURES:
        data = Path(s.files[name]).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000, name
    md = (tmp_path / "out" / SUMMARY_FILE).read_text()
    assert "steps: 1 → 18 (18 distinct, 4 redone after a resume, 0 missing)" in md
    assert "| 2 | r2 | 8 | step_8 | 18 | 143 |" in md and "none logged (killed?)" in md
    assert all(f"![{n}]({n}.png)" in md for n in FIGURES)
    back = json.loads(summary_json(s))
    assert back["files"]["summary"].endswith(SUMMARY_FILE) and back["saves"] == 5


def test_an_empty_log_still_gives_a_report(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    w = RunLogWriter(RunLogOptions(d, run_id="r", attempt=1, start_step=0, tensorboard=False)).start()
    w.close(final=Event("exit", 0, {"code": 2, "message": "bad config"}))
    s = write_report(read_history(d), tmp_path / "out")
    assert s.steps_logged == 0 and s.first_step is None
    assert all(Path(s.files[n]).stat().st_size > 0 for n in FIGURES)
    assert json.loads(summary_json(s))["reward_first"] is None


def test_saves_longer_than_the_preemption_notice_are_warned_about(tmp_path: Path) -> None:
    """checkpoint.preemption_notice_s (the start event's) against every published save's seconds."""
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="r1", attempt=1, start_step=0, tensorboard=False)).start()
    w.event(Event("start", 0, {"decision": "fresh", "preemption_notice_s": 1.0}))
    for s in range(1, 21):
        w.step(rec(s, 1))
        if s % 5 == 0:
            w.event(save(s))  # 0.1 s per step of the bundle: step_15 takes 1.5 s, step_20 2.0 s
    w.close(final=Event("exit", 20, {"code": 0, "final_step": 20}))
    s = summarize(read_history(tmp_path))
    assert (s.preemption_notice_s, s.saves_over_notice) == (1.0, [15, 20])
    md = write_report(read_history(tmp_path), tmp_path / "report")
    text = Path(md.files["summary"]).read_text()
    assert ("**warning**: 2 saves took longer than checkpoint.preemption_notice_s=1 s (step_15, step_20)" in text)
    assert "checkpoint.save_period is the real protection" in text


def test_without_a_preemption_notice_no_warning(history: RunHistory) -> None:
    s = summarize(history)
    assert s.preemption_notice_s is None and s.saves_over_notice == []
