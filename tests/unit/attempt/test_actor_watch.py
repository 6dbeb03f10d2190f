"""Which kind of death a Ray error names (``actor_watch.kind_of_error``): the first actor class in its text."""

from __future__ import annotations

from sc_app.attempt.actor_watch import kind_of_error
from sc_app.attempt.restore_scope import STORAGE, TRAINER


def test_a_rank_is_a_trainer_whether_it_started_as_one_or_as_a_spare() -> None:
    assert kind_of_error("The actor died unexpectedly: ray::TrainerWorker.train_step()") == TRAINER
    assert kind_of_error("The actor died unexpectedly: ray::TrainerSpare.train_step()") == TRAINER
    assert kind_of_error("SimpleStorageUnit died; TrainerSpare waited on it") == STORAGE, "the first class named"
    assert kind_of_error("no actor named here") is None
