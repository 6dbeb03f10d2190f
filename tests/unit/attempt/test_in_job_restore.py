"""in_job_restore.drive_restoring over a fake job (pure logic): what it tears down, fences, plans and reports, in
which order; when it ends the attempt instead (restores spent, a stop requested, the cluster no longer fits)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sc_app.attempt.in_job_restore import Death, drive_restoring
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
    start_fails: int = 0  # the first N rebuilds meet a death during setup
    reach: int = 7
    bundle_step: int = 4
    missing: str | None = None
    stopping: bool = False
    log: list[str] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    setups: int = 0
    reached: int = 0

    def start(self, plan: ResumePlan) -> tuple[Any, ResumePlan]:
        self.setups += 1
        if self.setups > 1 and self.start_fails > 0:
            self.start_fails -= 1
            self.log.append("start failed")
            raise JobFailed("trainer rank 0 died during setup")
        self.log.append(f"start {plan.step}")
        return FakeSetup(self.setups, self.log), plan

    def drive(self, setup: FakeSetup) -> RunSummary:
        if self.deaths > 0:
            self.deaths -= 1
            self.reached = self.reach
            raise JobFailed("a worker died")
        return RunSummary(final_step=10, weights_version=10)

    def what_died(self, setup: Any, exc: JobFailed) -> Death:
        return Death("trainer.worker", "trainer rank 0", died_at=None)

    def missing_resources(self) -> str | None:
        return self.missing

    def fence(self) -> None:
        self.log.append("fence")

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


def test_a_death_is_torn_down_fenced_replanned_and_reported_before_driving_on() -> None:
    job = FakeJob()
    summary, plan = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10 and plan.step == 4, "the plan of the rebuilt job is returned"
    assert job.log == ["start 0", "teardown 1", "fence", "replan", "start 4"], "fence before any new setup"
    (fault,) = job.faults
    assert (fault.kind, fault.outcome, fault.restored_step, fault.step) == ("trainer.worker", "recovered", 4, 7)
    assert fault.steps_redone == 3 and fault.prompts_lost == fault.prompts_duplicated == 0


def test_restores_are_bounded_per_attempt() -> None:
    job = FakeJob(deaths=3)
    with pytest.raises(JobFailed, match=r"after 2 in-job restores \(run.max_in_job_restores=2\)"):
        drive_restoring(job, FRESH, max_restores=2)
    assert len(job.faults) == 2 and job.log.count("fence") == 2
    assert job.log[-1] == "teardown 3", "the last failed job is torn down too"


def test_zero_restores_keeps_fail_stop() -> None:
    job = FakeJob()
    with pytest.raises(JobFailed, match="a worker died"):
        drive_restoring(job, FRESH, max_restores=0)
    assert "fence" not in job.log and not job.faults


def test_a_death_during_the_rebuild_counts_and_is_restored_again() -> None:
    job = FakeJob(start_fails=1)
    summary, _ = drive_restoring(job, FRESH, max_restores=3)
    assert summary.final_step == 10
    assert job.log == ["start 0", "teardown 1", "fence", "replan", "start failed", "fence", "replan", "start 4"]
    assert len(job.faults) == 1, "one fault: recovered once the rebuild stood"


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
    assert job.log == ["start 0", "teardown 1"], "torn down, never fenced or rebuilt"
    assert not job.faults
