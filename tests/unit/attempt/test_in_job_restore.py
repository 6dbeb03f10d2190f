"""in_job_restore.drive_restoring over a fake job (pure logic): the warm path (halt, re-plan, reset in place), the
full path (tear down, re-plan, set up), the fallback from one to the other, what each fences and reports, in which
order; one fault event per death (a death during a restore included); when it ends the attempt instead."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sc_app.attempt.in_job_restore import Death, Reset, ResetFailed, drive_restoring
from sc_app.checkpoint import ResumePlan
from sc_app.progress import FaultRecord, JobFailed, RunSummary


@dataclass
class FakeSetup:
    n: int
    log: list[str]

    def teardown(self) -> None:
        self.log.append(f"teardown {self.n}")


@dataclass
class FakeJob:
    """Drives fail ``deaths`` times (each after reaching ``reach``), then the job ends at step 10."""

    deaths: int = 1
    start_fails: int = 0  # the first N (re)builds meet a death during set-up
    first_start_fails: bool = False
    reset_fails: list[BaseException] = field(default_factory=list)  # what the next warm resets raise, in turn
    reach: int = 7
    bundle_step: int = 4
    missing: str | None = None
    stopping: bool = False
    died_at: float | None = None
    kinds: list[str] = field(default_factory=lambda: ["trainer.worker"])
    log: list[str] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    setups: int = 0
    reached: int = 0
    drained: int = 0  # steps the halted controller hands on (its unpolled progress)
    epoch: int = 1

    def start(self, plan: ResumePlan) -> tuple[Any, ResumePlan]:
        self.setups += 1
        if (self.setups == 1 and self.first_start_fails) or (self.setups > 1 and self.start_fails > 0):
            self.first_start_fails = False
            self.start_fails = max(0, self.start_fails - (self.setups > 1))
            self.log.append("start failed")
            raise JobFailed("a process of the job died while it was being set up (RayActorError: TrainerWorker)")
        self.log.append(f"start {plan.step}")
        return FakeSetup(self.setups, self.log), plan

    def drive(self, setup: FakeSetup) -> RunSummary:
        self.log.append("drive")
        if self.deaths > 0:
            self.deaths -= 1
            self.reached = self.reach
            raise JobFailed("a worker died")
        return RunSummary(final_step=10, weights_version=10)

    def what_died(self, setup: Any, exc: JobFailed) -> Death:
        kind = self.kinds.pop(0) if len(self.kinds) > 1 else self.kinds[0]
        return Death(kind, f"{kind} 0", died_at=self.died_at)

    def missing_resources(self) -> str | None:
        return self.missing

    def fence(self) -> int:
        self.log.append("fence")
        self.epoch += 1
        return self.epoch

    def halt(self, setup: Any) -> str:
        self.log.append("halt")
        self.reached, self.drained = self.reached + self.drained, 0  # handed on once
        return "generators"

    def reset(self, setup: Any, plan: ResumePlan, halted: Any, epoch: int) -> tuple[Any, Reset]:
        assert halted == "generators" and epoch == self.epoch
        if self.reset_fails:
            self.log.append("reset failed")
            raise self.reset_fails.pop(0)
        self.log.append(f"reset {plan.step} epoch {epoch}")
        return setup, Reset(["trainer rank 0"], ["generation worker 0"], {"reload": 0.5}, refused=2)

    def replan(self) -> ResumePlan:
        self.log.append("replan")
        return ResumePlan("resume", "newest", Path(f"step_{self.bundle_step}"), self.bundle_step)

    def step_reached(self) -> int:
        return self.reached

    def stop_requested(self) -> bool:
        return self.stopping

    def on_fault(self, record: FaultRecord) -> None:
        self.faults.append(record)


FRESH = ResumePlan("fresh", "no bundle")


def test_a_warm_restore_fences_halts_replans_and_resets_in_place() -> None:
    job = FakeJob(died_at=None, drained=1)  # the halted controller hands on step 8
    summary, plan = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10 and plan.step == 4, "the plan of the reset job is returned"
    assert job.log == ["start 0", "drive", "fence", "halt", "replan", "reset 4 epoch 2", "drive"], (
        "fenced before anything is reset; nothing torn down; the same setup driven on"
    )
    (fault,) = job.faults
    assert (fault.kind, fault.outcome, fault.restored_step, fault.path) == ("trainer.worker", "recovered", 4, "warm")
    assert fault.restarted == ("trainer rank 0",) and fault.reset == ("generation worker 0",)
    assert fault.stale_refused == 2
    assert fault.step == 8 and fault.steps_redone == 4, "the step the trainers reached counts (a dead controller)"
    assert set(fault.phase_seconds) >= {"detection", "fencing", "reload"}


def test_the_full_path_fences_halts_tears_down_replans_and_sets_up() -> None:
    job = FakeJob()
    summary, plan = drive_restoring(job, FRESH, max_restores=3, warm=False)
    assert summary.final_step == 10 and plan.step == 4
    assert job.log == ["start 0", "drive", "fence", "halt", "teardown 1", "replan", "start 4", "drive"]
    (fault,) = job.faults
    assert (fault.path, fault.step, fault.steps_redone, fault.restarted) == ("full", 7, 3, ("every actor of the job",))


def test_steps_the_live_controller_trained_after_the_last_poll_count_as_redone_on_the_full_path() -> None:
    """The chaos bench's full runs: "fault events claim 0 steps redone, the trace shows 2" when a step landed between
    the driver's last poll and the death; the halt hands it on (step 8 after 7)."""
    job = FakeJob(drained=1)
    drive_restoring(job, FRESH, max_restores=3, warm=False)
    (fault,) = job.faults
    assert (fault.path, fault.step, fault.steps_redone) == ("full", 8, 4)


def test_a_controller_that_will_not_halt_is_torn_down_as_it_is_on_the_full_path() -> None:
    job = FakeJob(drained=1)
    job.halt = lambda setup: (_ for _ in ()).throw(ResetFailed("did not halt within 30s"))  # type: ignore[method-assign]
    summary, _ = drive_restoring(job, FRESH, max_restores=3, warm=False)
    assert summary.final_step == 10
    (fault,) = job.faults
    assert (fault.path, fault.step) == ("full", 7)


@pytest.mark.parametrize(
    "failure", [ResetFailed("trainer rank 1 did not answer within 300s"), ResetFailed("load failed: OSError")]
)
def test_a_failed_warm_reset_falls_back_to_the_full_rebuild(failure: BaseException) -> None:
    job = FakeJob(reset_fails=[failure])
    summary, plan = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10 and plan.step == 4
    assert job.log == ["start 0", "drive", "fence", "halt", "replan", "reset failed", "teardown 1", "start 4", "drive"]
    (fault,) = job.faults
    assert fault.outcome == "recovered" and fault.path.startswith("full (warm reset failed: ")
    assert str(failure) in fault.path


def test_a_full_rebuild_that_fails_other_than_by_a_death_ends_the_attempt() -> None:
    class Broken(FakeJob):
        def start(self, plan: ResumePlan) -> tuple[Any, ResumePlan]:
            if self.setups:
                raise RuntimeError("bundle unreadable")
            return super().start(plan)

    job = Broken(reset_fails=[ResetFailed("timeout")])
    with pytest.raises(RuntimeError, match="bundle unreadable"):
        drive_restoring(job, FRESH, max_restores=3)


def test_a_death_during_a_warm_reset_is_a_death_of_its_own() -> None:
    """Issue 31 C: one event per death with its kind, no nesting, each with its own recovery seconds."""
    job = FakeJob(
        reset_fails=[JobFailed("generation worker 0 died")], kinds=["trainer.worker", "generation.worker"], drained=1
    )
    summary, _ = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10
    assert job.log.count("fence") == 2 and job.log[-2:] == ["reset 4 epoch 3", "drive"]
    first, second = job.faults
    assert (first.kind, first.outcome) == ("trainer.worker", "interrupted")
    assert first.error == "trainer.worker 0 died; its restore met another death"
    assert (second.kind, second.outcome, second.error) == ("generation.worker", "recovered", "generation.worker 0 died")
    assert first.steps_redone == 0 and second.steps_redone == 4, "the steps to redo are counted once"


def test_detection_is_the_time_since_the_recorded_death() -> None:
    import time

    job = FakeJob(died_at=time.time() - 2.0)
    drive_restoring(job, FRESH, max_restores=3)
    (fault,) = job.faults
    assert 2.0 <= fault.detection_seconds < 30 and fault.phase_seconds["detection"] >= 2.0


def test_restores_are_bounded_per_attempt() -> None:
    job = FakeJob(deaths=3)
    with pytest.raises(JobFailed, match=r"after 2 in-job restores \(run.max_in_job_restores=2\)"):
        drive_restoring(job, FRESH, max_restores=2)
    assert len(job.faults) == 2 and job.log.count("fence") == 2
    assert job.log[-1] == "teardown 1", "the last failed job is torn down before the attempt ends"


def test_zero_restores_keeps_fail_stop() -> None:
    job = FakeJob()
    with pytest.raises(JobFailed, match="a worker died"):
        drive_restoring(job, FRESH, max_restores=0)
    assert "fence" not in job.log and not job.faults


def test_a_death_during_the_full_rebuild_counts_and_is_restored_again() -> None:
    job = FakeJob(start_fails=1)
    summary, _ = drive_restoring(job, FRESH, max_restores=3, warm=False)
    assert summary.final_step == 10
    assert job.log == [
        *["start 0", "drive", "fence", "halt", "teardown 1", "replan", "start failed"],
        *["fence", "replan", "start 4", "drive"],
    ]
    assert [f.outcome for f in job.faults] == ["interrupted", "recovered"], "one event per death"
    assert job.faults[1].kind == "trainer.worker"


def test_a_death_during_the_first_set_up_is_restored_like_any_other() -> None:
    """Issue 31 B: not a traceback, not an unnamed exit 1 — restored in-job (counted), named in its event."""
    job = FakeJob(first_start_fails=True, deaths=0)
    summary, plan = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10 and plan.step == 4
    assert job.log == ["start failed", "fence", "replan", "start 4", "drive"], "no warm reset of a setup never built"
    (fault,) = job.faults
    assert fault.outcome == "recovered" and fault.path == "full"


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"missing": "the cluster no longer fits the job: no node has room for trainer rank 0"}, "no longer fits"),
        ({"stopping": True}, "died while stopping"),
    ],
)
def test_no_restore_when_the_cluster_lost_room_or_a_stop_was_asked(change: dict[str, Any], line: str) -> None:
    job = FakeJob(**change)
    with pytest.raises(JobFailed, match=line):
        drive_restoring(job, FRESH, max_restores=3)
    assert job.log == ["start 0", "drive", "teardown 1"], "torn down, never fenced or rebuilt"
    assert not job.faults


def test_steps_the_halted_controller_hands_on_count_as_redone_on_the_fallback_too() -> None:
    """The halt collects the progress the driver had not polled (step 8 after 7); the warm reset then fails and
    the full rebuild runs: the fault counts the steps from the bundle to 8, as the trace shows them redone (the
    two-suite CI failure of test_in_job_restore: "fault events claim 5 steps redone, the trace shows 6")."""
    job = FakeJob(drained=1, reset_fails=[ResetFailed("injected")])
    drive_restoring(job, FRESH, max_restores=3)
    (fault,) = job.faults
    assert fault.path.startswith("full") and (fault.step, fault.steps_redone) == (8, 4)
