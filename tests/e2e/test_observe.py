"""The run log, TensorBoard files, metrics and report of a job that is SIGKILLed, resumed, stopped and resumed again.

The suite's shared interrupted run (``interrupted_run``, ``tests/support/interrupted.py``), four attempts of the
real CLI on one checkpoint dir (real Ray, TransferQueue, files):
1. A: fresh, 4 steps, a bundle every 2 steps (exit 0);
2. B: resumes from ``step_4``; its third save (step 10) hangs in its disk phase after ``tmp_step_10/`` was made, so
   training logs a step or two past the newest bundle ``step_8``; then the whole session is SIGKILLed — no exit
   event, a leftover tmp dir;
3. C: resumes from ``step_8`` (the leftover quarantined), redoes the steps B logged past it, serves its metrics on an
   embedded export port (scraped and parsed), and is stopped with SIGTERM: emergency bundle, exit 143;
4. D: resumes from the emergency bundle and finishes (exit 0).
Then ``metrics.jsonl`` must hold every step once or more, redone ones marked, and the events of every attempt;
TensorBoard's reader must see each step once with the newest attempt's value; ``sc-app report`` must plot exactly
the log's effective series.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_app.observe.reader import read_history
from sc_app.observe.report import build_figures
from tests.support.cli import InProcess
from tests.support.interrupted import Interrupted
from tests.support.prometheus import one

pytestmark = pytest.mark.slow

B_NEWEST = 8  # the bundle B was killed after (its save of step 10 hung)


def test_every_step_is_logged_and_redone_steps_are_marked(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    h = read_history(k.ckpt / "logs")
    hw, stopped_at, final = k.high_water, k.stopped_at, k.final
    assert h.skipped <= 1, "at most the line a SIGKILL tore"
    assert h.missing_steps() == []
    eff = h.effective_steps()
    assert [s.step for s in eff] == list(range(1, final + 1))
    by_attempt = {n: [s for s in h.steps if s.stamp.attempt == n] for n in (1, 2, 3, 4)}
    assert [s.step for s in by_attempt[1]] == [1, 2, 3, 4] and not any(s.redone for s in by_attempt[1])
    assert [s.step for s in by_attempt[2]] == list(range(5, hw + 1)) and not any(s.redone for s in by_attempt[2])
    assert [s.step for s in by_attempt[3]] == list(range(B_NEWEST + 1, stopped_at + 1))
    redone = list(range(B_NEWEST + 1, hw + 1))
    assert [s.step for s in by_attempt[3] if s.redone] == redone, "the steps B logged past step_8 were trained twice"
    assert [s.step for s in by_attempt[4]] == list(range(stopped_at + 1, final + 1))
    assert not any(s.redone for s in by_attempt[4])
    newest = [1] * 4 + [2] * (B_NEWEST - 4) + [3] * (stopped_at - B_NEWEST) + [4] * 3
    assert [s.stamp.attempt for s in eff] == newest, "the newest attempt counts"
    for s in eff:
        r = s.record
        assert 0.0 <= r.reward_min <= r.reward_mean <= r.reward_max <= 1.0
        assert r.weights_version == s.step and r.step_seconds > 0 and r.rows_held >= 0
        assert r.commit_wait_max_s is not None and r.commit_wait_p99_s is not None


def test_every_attempt_says_how_it_started_and_ended(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    h = read_history(k.ckpt / "logs")
    stopped_at, final = k.stopped_at, k.final
    names = {n: [e.name for e in h.events if e.stamp.attempt == n] for n in (1, 2, 3, 4)}
    assert names[1][:2] == ["start", "lease_taken"] and names[1][-1] == "exit" and "resume" not in names[1]
    assert names[2] == ["start", "lease_taken", "resume", "save", "save"], "killed: no exit line"
    assert names[3][:4] == ["start", "lease_taken", "quarantine", "resume"]
    assert names[3][-4:] == ["stop_requested", "emergency_save", "goodput", "exit"]
    assert names[4][:3] == ["start", "lease_taken", "resume"] and names[4][-1] == "exit"

    run_ids = [a.run_id for a in h.attempts()]
    assert len(set(run_ids)) == 4
    leases = h.events_named("lease_taken")
    assert [e.data["epoch"] for e in leases] == [1, 2, 3, 4]
    assert [e.data["previous_run_id"] for e in leases] == [None, *run_ids[:3]]
    (quarantine,) = h.events_named("quarantine")
    assert "tmp_step_10" in quarantine.data["moved"][0]
    assert [(e.step, e.data["bundle"]) for e in h.events_named("resume")] == [
        (4, "step_4"),
        (B_NEWEST, f"step_{B_NEWEST}"),
        (stopped_at, f"step_{stopped_at}"),
    ]
    (emergency,) = h.events_named("emergency_save")
    assert emergency.step == stopped_at and emergency.data["bundle"] == f"step_{stopped_at}"
    assert emergency.data["bytes"] > 0 and emergency.data["seconds"] > 0
    assert [e.step for e in h.events_named("save") if e.stamp.attempt == 1] == [2, 4]
    assert [e.step for e in h.events_named("save") if e.stamp.attempt == 2] == [6, B_NEWEST]
    published = [e.step for e in h.events_named("save") if e.stamp.attempt == 4]
    assert published and published[-1] == final
    assert [(a.attempt, a.start_step, a.resumed_from, a.exit_code, a.final_step) for a in h.attempts()] == [
        (1, 0, None, 0, 4),
        (2, 4, "step_4", None, None),
        (3, B_NEWEST, f"step_{B_NEWEST}", 143, stopped_at),
        (4, stopped_at, f"step_{stopped_at}", 0, final),
    ]
    assert all(e.data["dropped"] == {"steps": 0, "events": 0, "write_failed": 0} for e in h.events_named("exit"))
    # the run names its log and the report command as its last lines
    assert f"run log: {k.ckpt / 'logs' / 'metrics.jsonl'}" in k.outs["D"]
    assert f"sc-app report --checkpoint-dir {k.ckpt}" in k.outs["D"]


def test_the_stopped_attempt_served_its_metrics_on_the_embedded_export_port(interrupted_run: Interrupted) -> None:
    k = interrupted_run
    got = k.scraped
    h = read_history(k.ckpt / "logs")
    run_id = h.attempts()[2].run_id
    assert {lab["run_id"] for lab, _ in got["ray_sc_app_step"]} == {run_id}
    assert one(got, "ray_sc_app_attempt") == 3
    assert one(got, "ray_sc_app_resumes_total") == 1
    assert one(got, "ray_sc_app_last_resume_timestamp_seconds") > 0
    step = one(got, "ray_sc_app_step")
    assert step > k.high_water
    logged_3 = {s.step: s.record for s in h.steps if s.stamp.attempt == 3}
    assert one(got, "ray_sc_app_weights_version") in {float(n) for n in logged_3}
    assert 0 < one(got, "ray_sc_app_train_steps_total") <= len(logged_3)
    assert one(got, "ray_sc_app_commit_wait_seconds_count") > 0
    assert {lab["stat"] for lab, _ in got["ray_sc_app_reward"]} == {"mean", "min", "max"}


def test_tensorboard_reads_back_each_step_once_with_the_newest_value(interrupted_run: Interrupted) -> None:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logs = interrupted_run.ckpt / "logs"
    assert len(list(logs.glob("events.out.tfevents.*"))) == 4, "one event file per attempt"
    acc = ea_mod.EventAccumulator(str(logs))
    acc.Reload()
    eff = read_history(logs).effective_steps()
    reward = acc.Scalars("train/reward_mean")
    assert [e.step for e in reward] == [s.step for s in eff]
    assert [e.value for e in reward] == pytest.approx([s.record.reward_mean for s in eff], rel=1e-6)
    assert [e.step for e in acc.Scalars("train/loss")] == [s.step for s in eff]
    assert [(e.step, e.value) for e in acc.Scalars("run/attempt")] == [
        (0, 1.0),
        (4, 2.0),
        (B_NEWEST, 3.0),
        (interrupted_run.stopped_at, 4.0),
    ]


def test_report_plots_the_logs_series(cli: InProcess, interrupted_run: Interrupted, tmp_path: Path) -> None:
    k = interrupted_run
    logs, out = k.ckpt / "logs", tmp_path / "report"
    res = cli("report", "--checkpoint-dir", str(k.ckpt), "--out", str(out), "--json")
    assert res.rc == 0, res.out[-3000:]
    summary = json.loads(res.out[res.out.index("{") :])
    for name in ("reward_loss", "step_time", "saves"):
        png = Path(summary["files"][name])
        assert png.parent == out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert Path(summary["files"]["summary"]).read_text().startswith("# sc-app run report")
    h = read_history(logs)
    eff = h.effective_steps()
    assert summary["first_step"] == 1 and summary["last_step"] == k.final
    assert summary["missing_steps"] == [] and summary["redone_lines"] == k.high_water - B_NEWEST
    assert summary["emergency_saves"] == 1 and summary["saves"] == len(h.saves())
    assert [a["exit_code"] for a in summary["attempts"]] == [0, None, 143, 0]

    # what the PNGs were drawn from: the same figures, built from the same log
    figs = build_figures(h)
    (reward_line,) = [a for ax in figs["reward_loss"].axes for a in ax.get_children() if a.get_gid() == "reward_mean"]
    assert list(reward_line.get_xdata()) == [s.step for s in eff]
    assert list(reward_line.get_ydata()) == [s.record.reward_mean for s in eff]
    resumes = {
        tuple(a.get_xdata()) for ax in figs["reward_loss"].axes for a in ax.get_children() if a.get_gid() == "resume"
    }
    assert resumes == {(4, 4), (B_NEWEST, B_NEWEST), (k.stopped_at, k.stopped_at)}
    (save_line,) = [a for ax in figs["saves"].axes for a in ax.get_children() if a.get_gid() == "save_seconds"]
    assert list(save_line.get_xdata()) == [e.step for e in h.saves()]
    assert list(save_line.get_ydata()) == [e.data["seconds"] for e in h.saves()]


def test_the_console_holds_sc_apps_lines_only_and_ray_logs_to_libraries_log(interrupted_run: Interrupted) -> None:
    """Issue 31, class K: Ray's and TransferQueue's own log lines (multi-line warnings included) go to
    ``libraries.log`` beside the run log; every attempt's console output is sc-app's, one line per event."""
    from tests.support.console import foreign_lines

    for letter, out in interrupted_run.outs.items():
        assert not foreign_lines(out), (letter, foreign_lines(out)[:5])
    libraries = interrupted_run.ckpt / "logs" / "libraries.log"
    assert libraries.is_file(), "Ray logs at least its start-up lines (authentication mode) in every attempt"
    assert " ray" in libraries.read_text() or "ray." in libraries.read_text()
