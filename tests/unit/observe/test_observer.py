"""JobObserver on real bundles, a real lease and a real run log; metrics go to a recording sink (pure mapping)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sc_app.checkpoint import plan_resume
from sc_app.checkpoint.lease import Lease
from sc_app.config.app import load_config
from sc_app.observe.observer import JobObserver, ObserveOptions, where_lines
from sc_app.observe.reader import read_history
from sc_app.observe.records import LOG_FILE, Event, StepMetrics
from sc_app.progress import SaveFailedRecord, SaveRecord, StepRecord, StopRecord
from tests.support.bundles import make_bundle, make_tmp_leftover


class Recorder:
    def __init__(self) -> None:
        self.steps: list[tuple[int, list[float]]] = []
        self.events: list[str] = []
        self.dropped_n: list[int] = []
        self.ticks = 0

    def step(self, rec: StepMetrics, commit_waits: Sequence[float] = ()) -> None:
        self.steps.append((rec.step, list(commit_waits)))

    def event(self, ev: Event, *, at: float | None = None) -> None:
        self.events.append(ev.name)

    def dropped(self, n: int) -> None:
        self.dropped_n.append(n)

    def tick(self) -> None:
        self.ticks += 1


def rec(step: int) -> StepMetrics:
    return StepMetrics(step, 0.5, 0.0, 1.0, -0.1, 1.0, 64, 0.1, step)


def progress_step(step: int, waits: tuple[float, ...] = (0.001,)) -> StepRecord:
    return StepRecord(
        step, 0.5, -0.1, 1.0, 64, 0.1, reward_min=0.0, reward_max=1.0, weights_version=step, commit_waits=waits
    )


def test_an_attempt_records_how_it_started_ran_and_ended(tmp_path: Path) -> None:
    make_bundle(tmp_path, 4)
    make_tmp_leftover(tmp_path, 6)
    Lease.acquire(tmp_path, "earlier")
    lease = Lease.acquire(tmp_path, "now")
    plan = plan_resume(tmp_path, tidy=True)
    assert plan.decision == "resume" and plan.quarantined
    logs = tmp_path / "logs"
    obs = JobObserver(ObserveOptions(logs, tensorboard=False, max_steps=8, save_period=2))
    obs.started("now", lease, plan)
    sink = Recorder()
    obs.attach_metrics(sink)
    assert sink.events == ["resume"], "the resume happened before Ray: metrics get it once attached"
    for record in (
        progress_step(5),
        SaveFailedRecord(5, "No space left on device", in_a_row=2, last_saved_step=4),
        progress_step(6, waits=(0.001, 0.004)),
        SaveRecord(6, "step_6", 0.2, 0.003, 0.002, groups=8, data_plane_bytes=4096, pruned=("step_2",)),
        StopRecord(6),
        SaveRecord(6, "step_6", 0.1, 0.001, 0.001, groups=8, data_plane_bytes=4096, emergency=True, on_bucket=True),
    ):
        obs.progress(record)
    result = obs.finish(143, "stopped on SIGTERM")
    assert result is not None and result.dropped.total == 0
    assert where_lines(load_config(overrides=[f"run.log_dir={logs}"]), obs)[0].startswith("goodput ")
    assert obs.finish(1) is None, "finish is idempotent"

    h = read_history(logs)
    names = [e.name for e in h.events]
    assert names == [
        "start",
        "lease_taken",
        "quarantine",
        "resume",
        "save_failed",
        "save",
        "prune",
        "stop_requested",
        "emergency_save",
        "goodput",
        "exit",
    ]
    start, lease_ev, quarantine, resume, failed, save, prune, _, emergency, goodput, exit_ev = h.events
    assert goodput.data["seconds"]["training"] >= 0 and goodput.data["faults"] == 0
    assert start.step == 4 and start.data["decision"] == "resume" and start.data["max_steps"] == 8
    assert lease_ev.data == {"epoch": 2, "previous_run_id": "earlier", "previous_epoch": 1}
    assert quarantine.data["moved"] and "tmp_step_6" in quarantine.data["moved"][0]
    assert resume.data["bundle"] == "step_4"
    assert failed.data == {"error": "No space left on device", "in_a_row": 2, "last_saved_step": 4}
    assert save.data == {
        "bundle": "step_6",
        "seconds": 0.2,
        "paused_seconds": 0.003,
        "window_seconds": 0.002,
        "bytes": 4096,
        "groups": 8,
    }
    assert prune.step == 6 and prune.data["removed"] == ["step_2"]
    assert emergency.step == 6 and emergency.data["seconds"] == 0.1
    assert emergency.data["on_bucket"] is True, "committed on the bucket alone (checkpoint.remote.parts=direct)"
    assert exit_ev.data["code"] == 143 and exit_ev.data["final_step"] == 6, "final step: the newest step seen"
    assert all(e.stamp.attempt == 2 and e.stamp.run_id == "now" for e in h.events)
    assert [s.step for s in h.steps] == [5, 6]
    six = h.steps[1].record
    assert (six.reward_min, six.reward_max, six.weights_version) == (0.0, 1.0, 6)
    assert six.commit_wait_p99_s == 0.004 and six.commit_wait_max_s == 0.004
    assert sink.steps == [(5, [0.001]), (6, [0.001, 0.004])], "metrics get every commit wait, not the summary"
    assert sink.events == ["resume", "save_failed", "save", "prune", "stop_requested", "emergency_save", "goodput"]


def test_a_superseded_attempt_logs_the_lost_lease_before_its_exit(tmp_path: Path) -> None:
    lease = Lease.acquire(tmp_path, "old")
    plan = plan_resume(tmp_path, tidy=True)
    obs = JobObserver(ObserveOptions(tmp_path / "logs", tensorboard=False)).started("old", lease, plan)
    obs.progress(progress_step(1))
    obs.finish(3, "superseded: checkpoint dir taken over by run new")
    lost, exit_ev = read_history(tmp_path / "logs").events[-2:]
    assert lost.name == "lease_lost" and lost.step == 1 and "taken over" in lost.data["message"]
    assert exit_ev.name == "exit" and exit_ev.data["code"] == 3


def test_nothing_is_recorded_before_the_attempt_started(tmp_path: Path) -> None:
    """A config or lease error ends ``sc-app run`` before ``run_job`` reports an attempt: no log is made."""
    obs = JobObserver(ObserveOptions(tmp_path / "logs"))
    obs.progress(progress_step(1))
    obs.ray_ready()
    assert obs.finish(2, "bad config") is None and obs.where() is None
    assert not (tmp_path / "logs").exists()


def test_options_follow_the_config(tmp_path: Path) -> None:
    cfg = load_config(overrides=[f"checkpoint.dir={tmp_path}", "run.max_steps=7", "checkpoint.save_period=3"])
    opts = ObserveOptions.of(cfg)
    assert opts.log_dir == tmp_path / "logs" and opts.max_steps == 7 and opts.save_period == 3
    assert opts.metrics and opts.tensorboard and opts.log_buffer == 10_000
    custom = load_config(overrides=[f"run.log_dir={tmp_path}/elsewhere", "run.log_buffer=5", "run.tensorboard=false"])
    opts = ObserveOptions.of(custom)
    assert opts.log_dir == tmp_path / "elsewhere" and opts.log_buffer == 5 and not opts.tensorboard
    off = ObserveOptions.of(load_config(overrides=["run.log_enabled=false", "run.metrics_enabled=false"]))
    assert off.log_dir is None and not off.metrics


def test_with_the_log_off_metrics_still_see_everything(tmp_path: Path) -> None:
    plan = plan_resume(tmp_path / "empty", tidy=True)
    obs = JobObserver(ObserveOptions(None, max_steps=2, save_period=1)).started("r", None, plan)
    sink = Recorder()
    obs.attach_metrics(sink)
    obs.step(rec(1))
    obs.event(Event("save", 1, {"seconds": 0.1}))
    assert obs.finish(0) is None
    assert sink.steps == [(1, [])] and sink.events == ["save", "goodput"] and sink.ticks == 1
    assert not (tmp_path / "empty").exists(), "no log directory is made when the log is off"


def test_records_lost_on_a_stalled_volume_reach_the_metrics(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / LOG_FILE)  # a hung volume: the writer thread blocks opening it
    plan = plan_resume(tmp_path / "ckpt", tidy=True)
    obs = JobObserver(
        ObserveOptions(logs, log_buffer=5, tensorboard=False, max_steps=100, save_period=10, close_timeout_s=60)
    ).started("r", None, plan)
    sink = Recorder()
    obs.attach_metrics(sink)
    assert obs.writer is not None
    deadline = time.monotonic() + 60
    while obs.writer.buffered:  # the thread took the start event and is stuck in open()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for s in range(1, 31):
        obs.step(rec(s))
    obs.tick()
    assert sum(sink.dropped_n) == obs.writer.dropped.total == 25
    drained: list[str] = []

    def drain() -> None:
        with open(logs / LOG_FILE) as fh:
            drained.extend(fh.read().splitlines())

    reader = threading.Thread(target=drain)
    reader.start()
    result = obs.finish(0, final_step=30)
    reader.join(60)
    assert result is not None and result.unwritten == 0
    assert any('"event":"dropped"' in line and '"steps":25' in line for line in drained)
    assert '"event":"exit"' in drained[-1]


def test_the_last_lines_name_the_log_and_the_report_command(tmp_path: Path) -> None:
    plan = plan_resume(tmp_path / "ckpt", tidy=True)
    default = load_config(overrides=[f"checkpoint.dir={tmp_path}/ckpt dir"])
    obs = JobObserver(ObserveOptions.of(default)).started("r", None, plan)
    log_line, report_line = where_lines(default, obs)  # no lease, no step: no goodput line
    assert log_line.startswith(f"run log: {tmp_path}/ckpt dir/logs/metrics.jsonl")
    assert report_line == f"plots and summary: sc-app report --checkpoint-dir '{tmp_path}/ckpt dir'"
    obs.finish(0)
    custom = load_config(overrides=[f"run.log_dir={tmp_path}/mine"])
    obs = JobObserver(ObserveOptions.of(custom)).started("r", None, plan)
    assert where_lines(custom, obs)[1] == f"plots and summary: sc-app report --log-dir {tmp_path}/mine"
    obs.finish(0)
    off = load_config(overrides=["run.log_enabled=false"])
    assert where_lines(off, JobObserver(ObserveOptions.of(off)).started("r", None, plan)) == []


def killed_attempt(root: Path, logged: range, bundles: dict[int, list[dict[str, Any]]], save_period: int) -> None:
    """Attempt 1 on ``root``: logs ``logged`` and is SIGKILLed (no exit line); ``bundles``: step → the steps its
    manifest keeps (``progress.step_summary``), published as that attempt would have."""
    from sc_app.checkpoint import BundleWriter
    from tests.support.bundles import write_contents

    first = JobObserver(ObserveOptions(root / "logs", tensorboard=False, max_steps=20, save_period=save_period))
    first.started("first", Lease.acquire(root, "first"), plan_resume(root, tidy=False))
    for n in logged:
        first.progress(progress_step(n))
    first.writer.close()  # type: ignore[union-attr]  # what was written before the kill; no exit line
    for step, kept in bundles.items():
        writer = BundleWriter(root, step).begin()
        record = write_contents(writer, step)
        writer.commit({**record, "steps": kept})


def resumed_attempt(root: Path, run_id: str, save_period: int) -> None:
    plan = plan_resume(root, tidy=False)
    assert plan.decision == "resume"
    obs = JobObserver(ObserveOptions(root / "logs", tensorboard=False, max_steps=20, save_period=save_period))
    obs.started(run_id, Lease.acquire(root, run_id), plan)
    obs.finish(0)


def test_steps_a_killed_attempt_never_logged_come_back_from_the_bundle(tmp_path: Path) -> None:
    """Attempt 1 logged steps 1..8, trained 9 and 10, published step_10, and was SIGKILLed before its writer wrote
    9 and 10. The bundle's manifest kept steps 9 and 10; attempt 2, resuming step_10, logs them (once)."""
    from sc_app.progress import step_summary

    logs = tmp_path / "logs"
    kept = [step_summary(progress_step(n)) for n in (9, 10)]
    kept[0]["loss"] = None  # a NaN loss is kept as null and comes back as NaN
    killed_attempt(tmp_path, range(1, 9), {10: kept}, save_period=10)
    resumed_attempt(tmp_path, "second", save_period=10)
    history = read_history(logs)
    assert [s.step for s in history.effective_steps()] == list(range(1, 11))
    (recovered,) = history.events_named("recovered")
    assert recovered.data["steps"] == [9, 10] and recovered.data["bundle"] == "step_10"

    resumed_attempt(tmp_path, "third", save_period=10)
    assert len(read_history(logs).events_named("recovered")) == 1, "a step already logged is not logged again"
    assert [s.step for s in read_history(logs).steps] == list(range(1, 11))


def test_steps_held_back_past_an_older_bundle_come_back_from_that_bundle(tmp_path: Path) -> None:
    """Attempt 1 logged steps 1..4 and was SIGKILLed with 5..10 still queued (its writer held back: a stalled volume,
    or TensorBoard's import before it had its own thread — the CI failure of test_manifest_e2e). step_5 kept 1..5,
    step_10 kept 6..10: attempt 2, resuming step_10, logs 6..10 from its manifest and 5 from step_5's, and reads no
    older manifest once one holds nothing the log lacks."""
    from sc_app.progress import step_summary

    spans = {5: range(1, 6), 10: range(6, 11)}
    kept = {step: [step_summary(progress_step(n)) for n in steps] for step, steps in spans.items()}
    killed_attempt(tmp_path, range(1, 5), kept, save_period=5)
    resumed_attempt(tmp_path, "second", save_period=5)
    history = read_history(tmp_path / "logs")
    assert [s.step for s in history.effective_steps()] == list(range(1, 11))
    assert [(e.data["bundle"], e.data["steps"]) for e in history.events_named("recovered")] == [
        ("step_10", [6, 7, 8, 9, 10]),
        ("step_5", [5]),
    ]
