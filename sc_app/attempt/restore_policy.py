"""The in-job restore policy: after a process of the job died, RESTORE the job in-job or END the attempt.

Named like Ray Train v2's failure decisions (``failure_policy.py``: RESTART / RAISE / NOOP); sc-app's has two
outcomes. Four rules end the attempt, asked in this order (the first that matches decides); a death none of them
matches is restored:

* ``OFF``: ``run.max_in_job_restores == 0`` → END with the death's own error (fail-stop);
* ``SPENT``: this attempt restored that many times already → END, ``<what> died after N in-job restores ...``;
* ``STOPPING``: a stop was requested → END, ``<what> died while stopping; ...``;
* ``UNFIT``: the cluster no longer fits the job (a node gone) → END, ``<what> died and <what has no room>; ...``;
* ``RESTORE``: none of the above → RESTORE.

What died names the processes in the line; it does not change the decision (every death in ``Death.kind`` is
restorable). The stop and fit questions are asked only when the rules before them let the restore go on (the fit
question reads the cluster's nodes). Pure: no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

RETRY_HINT = "a rerun resumes from the newest complete bundle"


@dataclass(frozen=True)
class Death:
    """What died: a ``FaultRecord`` kind, the processes by name, when (``time.time()``; None when unknown), and the
    one line its fault event carries (default: ``<names> died``)."""

    kind: str
    names: str
    died_at: float | None = None
    line: str = ""

    @property
    def error(self) -> str:
        return self.line or f"{self.names} died"


class Action(Enum):
    RESTORE = "restore"  # tear down, fence, plan again, set the job up on this cluster
    END = "end"  # end the attempt (JobFailed, exit 1): a retry resumes from the newest complete bundle


class Rule(Enum):
    OFF = "off"
    SPENT = "spent"
    STOPPING = "stopping"
    UNFIT = "unfit"
    RESTORE = "restore"


@dataclass(frozen=True)
class RestoreDecision:
    """The policy's answer: what to do, the rule that decided, and the attempt's last line when it ends (None: a
    restore, or ``OFF``, where the death's own error is the line)."""

    action: Action
    rule: Rule
    line: str | None = None


@dataclass(frozen=True)
class InJobRestorePolicy:
    """At most ``max_restores`` in-job restores per attempt (``run.max_in_job_restores``; 0: fail-stop)."""

    max_restores: int

    def decide(
        self,
        death: Death,
        restores: int,
        *,
        stop_requested: Callable[[], bool],
        missing_resources: Callable[[], str | None],
    ) -> RestoreDecision:
        """The decision after ``death``, this attempt having restored ``restores`` times so far.
        ``missing_resources``: what no longer fits the cluster (None when the job still fits)."""
        if self.max_restores == 0:
            return RestoreDecision(Action.END, Rule.OFF)
        if restores >= self.max_restores:
            line = (
                f"{death.names} died after {restores} in-job restores "
                f"(run.max_in_job_restores={self.max_restores}); {RETRY_HINT}"
            )
            return RestoreDecision(Action.END, Rule.SPENT, line)
        if stop_requested():
            return RestoreDecision(Action.END, Rule.STOPPING, f"{death.names} died while stopping; {RETRY_HINT}")
        missing = missing_resources()
        if missing:
            line = f"{death.names} died and {missing}; a retry on a new cluster resumes from the newest complete bundle"
            return RestoreDecision(Action.END, Rule.UNFIT, line)
        return RestoreDecision(Action.RESTORE, Rule.RESTORE)
