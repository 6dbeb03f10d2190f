"""restore_policy.InJobRestorePolicy as a table: what died, how often, a stop requested, the cluster's fit →
RESTORE in-job or END the attempt, with the rule that decided and the attempt's last line."""

from __future__ import annotations

import re

import pytest

from sc_app.attempt.restore_policy import Action, Death, InJobRestorePolicy, Rule

TRAINER = Death("trainer.worker", "trainer rank 1")
STORAGE = Death("data_plane.storage", "TransferQueueStorageUnit#0")
NODE = Death("node", "trainer rank 0 (their node is gone)")
UNFIT = "the cluster no longer fits the job: no node has room for trainer rank 0 (CPU=1)"


@pytest.mark.parametrize(
    ("death", "max_restores", "restores", "stopping", "missing", "action", "rule", "line"),
    [
        # in-job restore off: fail-stop, the death's own error is the line
        (TRAINER, 0, 0, False, None, Action.END, Rule.OFF, None),
        (NODE, 0, 0, True, UNFIT, Action.END, Rule.OFF, None),
        # how often: the bound counts this attempt's restores, whatever died
        (TRAINER, 3, 0, False, None, Action.RESTORE, Rule.RESTORE, None),
        (STORAGE, 3, 2, False, None, Action.RESTORE, Rule.RESTORE, None),
        (STORAGE, 3, 3, False, None, Action.END, Rule.SPENT, r"^TransferQueueStorageUnit#0 died after 3 in-job "),
        (TRAINER, 1, 1, True, UNFIT, Action.END, Rule.SPENT, r"\(run\.max_in_job_restores=1\); a rerun resumes"),
        # a stop requested: never rebuilt
        (TRAINER, 3, 0, True, None, Action.END, Rule.STOPPING, r"^trainer rank 1 died while stopping; a rerun "),
        (NODE, 3, 1, True, UNFIT, Action.END, Rule.STOPPING, r"died while stopping"),
        # the cluster no longer fits: the line names what has no room; a retry on a new cluster
        (NODE, 3, 0, False, UNFIT, Action.END, Rule.UNFIT, r"^trainer rank 0 \(their node is gone\) died and the "),
        (NODE, 3, 2, False, UNFIT, Action.END, Rule.UNFIT, r"no node has room for trainer rank 0 .*a new cluster"),
        (NODE, 3, 0, False, None, Action.RESTORE, Rule.RESTORE, None),
    ],
)
def test_the_policy_table(
    death: Death,
    max_restores: int,
    restores: int,
    stopping: bool,
    missing: str | None,
    action: Action,
    rule: Rule,
    line: str | None,
) -> None:
    decision = InJobRestorePolicy(max_restores).decide(
        death, restores, stop_requested=lambda: stopping, missing_resources=lambda: missing
    )
    assert (decision.action, decision.rule) == (action, rule)
    if line is None:
        assert decision.line is None
    else:
        assert decision.line is not None
        assert decision.line.count("\n") == 0
        assert re.search(line, decision.line), decision.line


def test_the_stop_and_fit_questions_are_asked_only_when_the_rules_before_them_let_the_restore_go_on() -> None:
    asked: list[str] = []

    def stopping() -> bool:
        asked.append("stop")
        return False

    def missing() -> str | None:
        asked.append("fit")
        return None

    policy = InJobRestorePolicy(2)
    assert policy.decide(TRAINER, 2, stop_requested=stopping, missing_resources=missing).rule is Rule.SPENT
    assert InJobRestorePolicy(0).decide(TRAINER, 0, stop_requested=stopping, missing_resources=missing).rule is Rule.OFF
    assert asked == [], "no question once the bound decided"
    assert policy.decide(TRAINER, 1, stop_requested=stopping, missing_resources=missing).action is Action.RESTORE
    assert asked == ["stop", "fit"], "the stop request first, the cluster's nodes last"
