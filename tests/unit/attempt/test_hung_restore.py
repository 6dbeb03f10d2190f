"""ClusterJob after a hang (no Ray started: the watch is a fake): the silent processes are killed and named, a hung
controller actor is never halted (no run.reset_timeout_s wait on it: the dead-controller path), and a hang no
process is found for fails the warm path over to the full rebuild."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sc_app.attempt import cluster_job
from sc_app.attempt.actor_watch import DeadActor
from sc_app.attempt.cluster_job import ClusterJob
from sc_app.attempt.in_job_restore import ResetFailed
from sc_app.attempt.restore_scope import CONTROLLER, STORAGE, TRAINER, JobActor
from sc_app.config.app import AppConfig
from sc_app.waits import ProcessHung

ACTORS = [
    JobActor("t0", TRAINER, "trainer rank 0"),
    JobActor("c", CONTROLLER, "the controller actor"),
    JobActor("s0", STORAGE, "unit 0"),
]


class FakeWatch:
    """``JobActors`` without Ray: ``silent`` do not answer the probe; ``kill_hung`` records what it killed."""

    def __init__(self, silent: set[str]) -> None:
        self.actors, self.silent, self.killed, self.probed_for = ACTORS, silent, [], 0.0

    def probe(self, seconds: float) -> set[str]:
        self.probed_for = seconds
        return {a.actor_id for a in ACTORS} - self.silent

    def kill_hung(self, hung: list[JobActor], since: float | None) -> list[DeadActor]:
        self.killed = [a.name for a in hung]
        return [DeadActor(a.kind, a.name, "", True, since, a.actor_id, hung=True) for a in hung]

    def dead(self) -> list[DeadActor]:
        return []


def job_with(watch: FakeWatch, monkeypatch: pytest.MonkeyPatch) -> tuple[ClusterJob, list[str]]:
    calls: list[str] = []
    cfg = AppConfig.model_validate({"run": {"hang_timeout_s": 60}})
    job = ClusterJob(SimpleNamespace(cfg=cfg), lambda: False, lambda *_: (None, None))
    job._watch = watch  # type: ignore[assignment]
    monkeypatch.setattr(job, "_steps_of_dead_controller", lambda setup: calls.append("steps from trainer rank 0"))

    def halt(actor: Any, timeout_s: float) -> list[Any]:
        calls.append(f"halt {timeout_s:g}")
        return []

    monkeypatch.setattr(cluster_job, "halt_controller", halt)
    monkeypatch.setattr(job, "_progress", lambda record: None)
    return job, calls


SETUP = SimpleNamespace(actor=SimpleNamespace(progress=SimpleNamespace(remote=lambda seen: None)))
JOB_SILENT = ProcessHung("hang", "the job", 60.0, "run.hang_timeout_s=60s")
CONTROLLER_SILENT = ProcessHung(CONTROLLER, "the controller actor", 60.0, "run.hang_timeout_s=60s")


def test_a_hung_storage_unit_is_killed_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = FakeWatch({"s0"})
    job, calls = job_with(watch, monkeypatch)
    death = job.what_died(SETUP, JOB_SILENT)
    assert watch.killed == ["unit 0"] and watch.probed_for == cluster_job.PROBE_S
    assert (death.kind, death.names) == ("hang", "unit 0")
    assert "unit 0 hung" in death.error and "killed" in death.error
    assert [d.actor_id for d in job._gone()] == ["s0"]
    monkeypatch.setattr(cluster_job.ray, "get", lambda *a, **k: [])
    assert job.halt(SETUP) == [] and calls == ["halt 300"]  # the live controller is halted as usual


def test_a_hung_controller_is_killed_not_halted(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = FakeWatch(set())  # it answered the probe by now: its own heartbeat named it, it is killed anyway
    job, calls = job_with(watch, monkeypatch)
    death = job.what_died(SETUP, CONTROLLER_SILENT)
    assert watch.killed == ["the controller actor"] and death.names == "the controller actor"
    assert job.halt(SETUP) is None  # the dead-controller path: no halt, no run.reset_timeout_s wait
    assert calls == ["steps from trainer rank 0"]


def test_a_hang_no_process_is_found_for_rebuilds_the_whole_job(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = FakeWatch(set())
    job, calls = job_with(watch, monkeypatch)
    death = job.what_died(SETUP, JOB_SILENT)
    assert watch.killed == [] and death.names == "the job"
    with pytest.raises(ResetFailed, match="the hung one is not known"):
        job.halt(SETUP)
    assert calls == []


def test_the_probe_is_bounded_by_the_hang_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    watch = FakeWatch({"t0"})
    job, _ = job_with(watch, monkeypatch)
    job.attempt.cfg = AppConfig.model_validate({"run": {"hang_timeout_s": 3}})
    job.what_died(SETUP, JOB_SILENT)
    assert watch.probed_for == 3.0 and watch.killed == ["trainer rank 0"]


def test_after_a_hang_the_halted_controllers_step_records_are_not_logged() -> None:
    """A step that finished after the job went silent (its hung process killed, the call then answered) holds the
    frozen seconds: the drain hands on its save and fault records, never its steps. After a death every record of
    the drain is a step trained before it, and is kept."""
    from sc_app.progress import SaveRecord, StepRecord

    step = StepRecord(step=5, reward=0.5, loss=0.1, staleness=0.0, rows_held=0, step_seconds=25.6)
    save = SaveRecord(step=5, bundle="step_5", seconds=1, paused_seconds=0, window_seconds=0, groups=1,
                      data_plane_bytes=0)
    assert cluster_job.drained_after_halt([step, save], after_hang=True) == [save]
    assert cluster_job.drained_after_halt([step, save], after_hang=False) == [step, save]
