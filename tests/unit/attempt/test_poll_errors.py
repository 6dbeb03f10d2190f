"""``sc_app.attempt.poll.job_errors``: what the driver makes of an error out of the controller. A foreign error (a
survivor's collective failing on its dead peer) that arrives before the GCS records the death is that death; an
error of sc-app's own is raised at once, as it is."""

from __future__ import annotations

import pytest
import ray

from sc_app.attempt.actor_watch import TRAINER, ActorsDied, DeadActor
from sc_app.attempt.poll import job_errors
from sc_app.checkpoint.lease import LeaseLost


def task_error(cause: BaseException) -> ray.exceptions.RayTaskError:
    return ray.exceptions.RayTaskError("SingleControllerActor.run", "Traceback: ...", cause)


class Watch:
    """Reports a dead trainer rank from its ``after``-th call on (the GCS catching up with the error)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.calls = after, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.after is not None and self.calls >= self.after:
            raise ActorsDied([DeadActor(TRAINER, "trainer rank 0", "n1", True, 1.0)])


def test_a_foreign_error_with_a_death_behind_it_is_that_death() -> None:
    watch = Watch(after=3)
    with pytest.raises(ActorsDied, match="trainer rank 0 died"), job_errors(watch, grace_s=10):
        raise task_error(RuntimeError("[gloo] Connection reset by peer"))
    assert watch.calls == 3


def test_a_foreign_error_without_a_death_is_raised_as_it_is_after_the_grace() -> None:
    watch = Watch(after=None)
    with pytest.raises(RuntimeError, match="Connection reset"), job_errors(watch, grace_s=0.2):
        raise task_error(RuntimeError("[gloo] Connection reset by peer"))
    assert watch.calls >= 1


def test_an_error_of_sc_apps_own_is_raised_at_once() -> None:
    watch = Watch(after=1)
    with pytest.raises(LeaseLost), job_errors(watch, grace_s=10):
        raise task_error(LeaseLost("taken over by run r2"))
    assert watch.calls == 0
