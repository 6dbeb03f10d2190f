"""The run log, TensorBoard files, metrics and report of a job that is SIGKILLed, resumed, stopped and resumed again.

Three attempts of the real CLI on one checkpoint dir (real Ray, TransferQueue, files):
1. fresh, a bundle every 2 steps; the third save hangs in its disk phase (``save.policy``, fault action ``delay``)
   after ``tmp_step_6/`` was made, so training logs a step or two past the newest bundle; then the whole session
   is SIGKILLed — no exit event, a leftover tmp dir;
2. resumes from ``step_4`` (the leftover quarantined), redoes the steps attempt 1 logged past it, serves its
   metrics on an embedded export port (scraped and parsed here), and is stopped with SIGTERM: emergency bundle,
   exit 143;
3. resumes from the emergency bundle and finishes (exit 0).
Then ``metrics.jsonl`` must hold every step once or more, redone ones marked, and the events of every attempt;
TensorBoard's reader must see each step once with the newest attempt's value; ``sc-app report`` must plot exactly
the log's effective series.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from sc_app.observe.reader import RunHistory, read_history
from sc_app.observe.report import build_figures
from tests.support.proc import kill_session, sc_app, start_logged, wait_for
from tests.support.prometheus import free_port, one, try_scrape

pytestmark = pytest.mark.slow

LONG = "500"  # max steps of the attempts that are killed or stopped: they never get there
SCRAPE_INTERVAL_MS = "2000"  # RAY_metrics_report_interval_ms for attempt 2, so its metrics show within seconds


def bundles(root: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name))


def history(logs: Path) -> RunHistory:
    return read_history(logs) if (logs / "metrics.jsonl").exists() else RunHistory(logs / "metrics.jsonl")


def logged(logs: Path, attempt: int) -> list[int]:
    return [s.step for s in history(logs).steps if s.stamp.attempt == attempt]


def logged_saves(logs: Path, attempt: int) -> list[int]:
    return [e.step for e in history(logs).events_named("save") if e.stamp.attempt == attempt]


def tensorboard_steps(logs: Path) -> set[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logs))
    acc.Reload()
    return {e.step for e in acc.Scalars("train/reward_mean")} if "train/reward_mean" in acc.Tags()["scalars"] else set()


def run_args(ckpt: Path, max_steps: str, save_period: int, *extra: str) -> list[str]:
    return [
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        max_steps,
        "--set",
        f"checkpoint.save_period={save_period}",
        *extra,
    ]


@pytest.fixture(scope="module")
def three_attempts(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("observe")
    ckpt, logs = tmp / "ckpt", tmp / "ckpt" / "logs"

    # attempt 1: the third save (step 6) hangs after making tmp_step_6/; SIGKILL once step 6 is logged
    hang = {
        "SC_APP_FAULT_AT": "save.policy",
        "SC_APP_FAULT_ACTION": "delay",
        "SC_APP_FAULT_DELAY_S": "3600",
        "SC_APP_FAULT_AFTER": "2",
    }
    proc = start_logged(*run_args(ckpt, LONG, 2), log=tmp / "a1.log", env=hang)
    try:
        wait_for(lambda: 6 in logged(logs, 1), 300, "attempt 1 to log step 6", proc)
        # saves publish behind training: step_4's save event may be logged after step 6 trained
        wait_for(lambda: logged_saves(logs, 1) == [2, 4], 120, "attempt 1 to log the saves of steps 2 and 4", proc)
        wait_for(lambda: 6 in tensorboard_steps(logs), 60, "attempt 1's TensorBoard points up to step 6", proc)
        assert bundles(ckpt) == [2, 4] and len(list(ckpt.glob("tmp_step_6.*"))) == 1  # named after its run
    finally:
        kill_session(proc.pid)  # SIGKILL, driver and Ray alike
    high_water_1 = max(logged(logs, 1))

    # attempt 2: resumes from step_4; its metrics are scraped, then SIGTERM
    port = free_port()
    proc = start_logged(
        *run_args(ckpt, LONG, 100, "--set", f"ray.metrics_export_port={port}"),
        log=tmp / "a2.log",
        env={"RAY_metrics_report_interval_ms": SCRAPE_INTERVAL_MS},
    )
    scraped: dict = {}

    def metrics_show_a_step_past_the_redo() -> bool:
        got = try_scrape(port)
        if got.get("ray_sc_app_step") and one(got, "ray_sc_app_step") > high_water_1:
            scraped.update(got)
            return True
        return False

    try:
        wait_for(metrics_show_a_step_past_the_redo, 300, "attempt 2's metrics on its export port", proc)
        os.kill(proc.pid, signal.SIGTERM)  # the driver alone, as Kubernetes signals a pod's PID 1
        rc2 = proc.wait(timeout=180)
    finally:
        kill_session(proc.pid)
    a2_out = (tmp / "a2.log").read_text()
    assert rc2 == 143, a2_out[-3000:]
    stopped_at = bundles(ckpt)[-1]

    # attempt 3: resumes from the emergency bundle and finishes
    final = stopped_at + 3
    done = sc_app(*run_args(ckpt, str(final), 2), timeout=300)
    assert done.rc == 0, done.out[-3000:]
    return {
        "ckpt": ckpt,
        "logs": logs,
        "high_water_1": high_water_1,
        "stopped_at": stopped_at,
        "final": final,
        "scraped": scraped,
        "a2_out": a2_out,
        "a3_out": done.out,
        "tmp": tmp,
    }


def test_every_step_is_logged_and_redone_steps_are_marked(three_attempts: dict) -> None:
    h = read_history(three_attempts["logs"])
    hw, stopped_at, final = three_attempts["high_water_1"], three_attempts["stopped_at"], three_attempts["final"]
    assert h.skipped <= 1, "at most the line a SIGKILL tore"
    assert h.missing_steps() == []
    eff = h.effective_steps()
    assert [s.step for s in eff] == list(range(1, final + 1))
    by_attempt = {n: [s for s in h.steps if s.stamp.attempt == n] for n in (1, 2, 3)}
    assert [s.step for s in by_attempt[1]] == list(range(1, hw + 1)) and not any(s.redone for s in by_attempt[1])
    assert [s.step for s in by_attempt[2]] == list(range(5, stopped_at + 1))
    assert [s.step for s in by_attempt[2] if s.redone] == list(range(5, hw + 1)), "steps 5.. were trained twice"
    assert [s.step for s in by_attempt[3]] == list(range(stopped_at + 1, final + 1))
    assert not any(s.redone for s in by_attempt[3])
    assert [s.stamp.attempt for s in eff] == [1] * 4 + [2] * (stopped_at - 4) + [3] * 3, "the newest attempt counts"
    for s in eff:
        r = s.record
        assert 0.0 <= r.reward_min <= r.reward_mean <= r.reward_max <= 1.0
        assert r.weights_version == s.step and r.step_seconds > 0 and r.rows_held >= 0
        assert r.commit_wait_max_s is not None and r.commit_wait_p99_s is not None


def test_every_attempt_says_how_it_started_and_ended(three_attempts: dict) -> None:
    h = read_history(three_attempts["logs"])
    stopped_at, final = three_attempts["stopped_at"], three_attempts["final"]
    names = {n: [e.name for e in h.events if e.stamp.attempt == n] for n in (1, 2, 3)}
    assert names[1] == ["start", "lease_taken", "save", "save"], "killed: no exit line"
    assert names[2][:4] == ["start", "lease_taken", "quarantine", "resume"]
    assert names[2][-4:] == ["stop_requested", "emergency_save", "goodput", "exit"]
    assert names[3][:3] == ["start", "lease_taken", "resume"] and names[3][-1] == "exit"

    run_ids = [a.run_id for a in h.attempts()]
    assert len(set(run_ids)) == 3
    leases = h.events_named("lease_taken")
    assert [e.data["epoch"] for e in leases] == [1, 2, 3]
    assert [e.data["previous_run_id"] for e in leases] == [None, run_ids[0], run_ids[1]]
    (quarantine,) = h.events_named("quarantine")
    assert "tmp_step_6" in quarantine.data["moved"][0]
    assert [(e.step, e.data["bundle"]) for e in h.events_named("resume")] == [
        (4, "step_4"),
        (stopped_at, f"step_{stopped_at}"),
    ]
    (emergency,) = h.events_named("emergency_save")
    assert emergency.step == stopped_at and emergency.data["bundle"] == f"step_{stopped_at}"
    assert emergency.data["bytes"] > 0 and emergency.data["seconds"] > 0
    assert [e.step for e in h.events_named("save") if e.stamp.attempt == 1] == [2, 4]
    published = [e.step for e in h.events_named("save") if e.stamp.attempt == 3]
    assert published and published[-1] == final
    assert [(a.attempt, a.start_step, a.resumed_from, a.exit_code, a.final_step) for a in h.attempts()] == [
        (1, 0, None, None, None),
        (2, 4, "step_4", 143, stopped_at),
        (3, stopped_at, f"step_{stopped_at}", 0, final),
    ]
    assert all(e.data["dropped"] == {"steps": 0, "events": 0, "write_failed": 0} for e in h.events_named("exit"))
    # the run names its log and the report command as its last lines
    assert f"run log: {three_attempts['logs'] / 'metrics.jsonl'}" in three_attempts["a3_out"]
    assert f"sc-app report --checkpoint-dir {three_attempts['ckpt']}" in three_attempts["a3_out"]


def test_attempt_2_served_its_metrics_on_the_embedded_export_port(three_attempts: dict) -> None:
    got = three_attempts["scraped"]
    h = read_history(three_attempts["logs"])
    run_id = h.attempts()[1].run_id
    assert {lab["run_id"] for lab, _ in got["ray_sc_app_step"]} == {run_id}
    assert one(got, "ray_sc_app_attempt") == 2
    assert one(got, "ray_sc_app_resumes_total") == 1
    assert one(got, "ray_sc_app_last_resume_timestamp_seconds") > 0
    step = one(got, "ray_sc_app_step")
    assert step > three_attempts["high_water_1"]
    logged_2 = {s.step: s.record for s in h.steps if s.stamp.attempt == 2}
    assert one(got, "ray_sc_app_weights_version") in {float(n) for n in logged_2}
    assert 0 < one(got, "ray_sc_app_train_steps_total") <= len(logged_2)
    assert one(got, "ray_sc_app_commit_wait_seconds_count") > 0
    assert {lab["stat"] for lab, _ in got["ray_sc_app_reward"]} == {"mean", "min", "max"}


def test_tensorboard_reads_back_each_step_once_with_the_newest_value(three_attempts: dict) -> None:
    ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    logs = three_attempts["logs"]
    assert len(list(logs.glob("events.out.tfevents.*"))) == 3, "one event file per attempt"
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
        (three_attempts["stopped_at"], 3.0),
    ]


def test_report_plots_the_logs_series(three_attempts: dict) -> None:
    ckpt, logs, tmp = three_attempts["ckpt"], three_attempts["logs"], three_attempts["tmp"]
    out = tmp / "report"
    res = sc_app("report", "--checkpoint-dir", str(ckpt), "--out", str(out), "--json", timeout=180)
    assert res.rc == 0, res.out[-3000:]
    summary = json.loads(res.out[res.out.index("{") :])
    for name in ("reward_loss", "step_time", "saves"):
        png = Path(summary["files"][name])
        assert png.parent == out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert Path(summary["files"]["summary"]).read_text().startswith("# sc-app run report")
    h = read_history(logs)
    eff = h.effective_steps()
    assert summary["first_step"] == 1 and summary["last_step"] == three_attempts["final"]
    assert summary["missing_steps"] == [] and summary["redone_lines"] == three_attempts["high_water_1"] - 4
    assert summary["emergency_saves"] == 1 and summary["saves"] == len(h.saves())
    assert [a["exit_code"] for a in summary["attempts"]] == [None, 143, 0]

    # what the PNGs were drawn from: the same figures, built from the same log
    figs = build_figures(h)
    (reward_line,) = [a for ax in figs["reward_loss"].axes for a in ax.get_children() if a.get_gid() == "reward_mean"]
    assert list(reward_line.get_xdata()) == [s.step for s in eff]
    assert list(reward_line.get_ydata()) == [s.record.reward_mean for s in eff]
    resumes = {
        tuple(a.get_xdata()) for ax in figs["reward_loss"].axes for a in ax.get_children() if a.get_gid() == "resume"
    }
    assert resumes == {(4, 4), (three_attempts["stopped_at"], three_attempts["stopped_at"])}
    (save_line,) = [a for ax in figs["saves"].axes for a in ax.get_children() if a.get_gid() == "save_seconds"]
    assert list(save_line.get_xdata()) == [e.step for e in h.saves()]
    assert list(save_line.get_ydata()) == [e.data["seconds"] for e in h.saves()]
