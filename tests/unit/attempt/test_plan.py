"""attempt.run.Attempt.plan: one place plans an attempt, at each moment it does — before the lease (moves nothing),
as the lease holder (tidies, announced), after a bundle failed to restore, after an in-job restore's teardown."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sc_app.attempt.run import Attempt, AttemptStarted, JobCallbacks
from sc_app.attempt.setup import ResumeRefused
from sc_app.checkpoint import BundleRules, ResumePlan, layout
from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.lineage import ensure_lineage
from sc_app.config.app import AppConfig
from tests.support.bundles import make_bundle, make_tmp_leftover


class Heard:
    def __init__(self) -> None:
        self.plans: list[ResumePlan] = []
        self.attempts: list[AttemptStarted] = []

    def calls(self) -> JobCallbacks:
        return JobCallbacks(on_plan=self.plans.append, on_attempt=self.attempts.append)


def attempt_on(root: Path, heard: Heard, *, holder: bool) -> Attempt:
    cfg = AppConfig.model_validate({"checkpoint": {"dir": str(root)}})
    attempt = Attempt(cfg, "run-a", BundleRules.of_dir(root), None, time.perf_counter(), heard.calls())
    attempt.lease = Lease.acquire(root, "run-a") if holder else None
    return attempt


def test_a_look_before_the_lease_moves_nothing_and_reports_nothing(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    leftover = make_tmp_leftover(tmp_path, 4)
    heard = Heard()
    plan = attempt_on(tmp_path, heard, holder=False).plan("look")
    assert (plan.decision, plan.step, plan.quarantined) == ("resume", 2, [])
    assert leftover.is_dir() and heard.plans == [] and heard.attempts == []


def test_the_holders_start_plan_tidies_and_is_announced_with_the_lease(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    leftover = make_tmp_leftover(tmp_path, 4)
    heard = Heard()
    attempt = attempt_on(tmp_path, heard, holder=True)
    plan = attempt.plan("start")
    assert plan.step == 2 and len(plan.quarantined) == 1 and not leftover.exists()
    assert heard.plans == [plan]
    assert [(a.run_id, a.lease, a.plan) for a in heard.attempts] == [("run-a", attempt.lease, plan)]


@pytest.mark.parametrize("moment", ["look", "start", "fallback", "restore"])
def test_a_refused_plan_is_reported_then_raised_at_every_moment(tmp_path: Path, moment: str) -> None:
    ensure_lineage(tmp_path, adopt="ours")
    make_bundle(tmp_path, 6, lineage="theirs")  # never ours to resume: a refusal
    heard = Heard()
    with pytest.raises(ResumeRefused, match="none of the 1 bundles"):
        attempt_on(tmp_path, heard, holder=moment != "look").plan(moment)  # type: ignore[arg-type]
    assert [p.decision for p in heard.plans] == ["refuse"]
    assert len(heard.attempts) == (1 if moment in ("look", "start") else 0), "announced where the attempt starts"
    assert (tmp_path / layout.step_name(6)).is_dir(), "a refusal moves nothing"


def test_a_fallback_skips_the_unrestorable_bundle_and_never_starts_fresh(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    make_bundle(tmp_path, 4)
    heard = Heard()
    attempt = attempt_on(tmp_path, heard, holder=True)
    plan = attempt.plan("fallback", unrestorable={"step_4": "its data plane did not load"})
    assert plan.step == 2 and heard.plans == [plan] and heard.attempts == []
    assert "its data plane did not load" in " ".join(p for r in plan.reports for p in r.problems)
    with pytest.raises(ResumeRefused):
        attempt_on(tmp_path / "empty", Heard(), holder=False).plan("fallback", unrestorable={"step_9": "gone"})


def test_an_in_job_restore_may_start_fresh_and_is_reported(tmp_path: Path) -> None:
    heard = Heard()
    plan = attempt_on(tmp_path, heard, holder=True).plan("restore")
    assert plan.decision == "fresh" and heard.plans == [plan] and heard.attempts == []
