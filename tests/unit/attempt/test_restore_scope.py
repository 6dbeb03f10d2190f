"""restore_scope (pure): after a hang, which processes are killed (no answer to the probe; the controller actor when
its own heartbeat named it), and then, as for any death, which start again and which are reset in place."""

from __future__ import annotations

import pytest

from sc_app.attempt.restore_scope import (
    CONTROLLER,
    GENERATION,
    STORAGE,
    TQ_CONTROLLER,
    TRAINER,
    JobActor,
    hung,
    scope,
    unfound_line,
)

HANG = "hang"  # poll.HANG: the job reported nothing (no process named)
T0, T1 = JobActor("t0", TRAINER, "trainer rank 0"), JobActor("t1", TRAINER, "trainer rank 1")
C = JobActor("c", CONTROLLER, "the controller actor")
Q = JobActor("q", TQ_CONTROLLER, "the TransferQueue controller")
S0, S1 = JobActor("s0", STORAGE, "unit 0"), JobActor("s1", STORAGE, "unit 1")
G0 = JobActor("g0", GENERATION, "generation worker 0")
JOB = [T0, T1, C, Q, S0, S1, G0]
DATA_PLANE = ("the TransferQueue controller", "unit 0", "unit 1")


def ids(*actors: JobActor) -> set[str]:
    return {a.actor_id for a in actors}


@pytest.mark.parametrize(
    ("heartbeat", "silent", "killed"),
    [
        (HANG, [T1], [T1]),  # a stopped trainer rank: its control thread does not answer
        (HANG, [S0], [S0]),  # a stopped storage unit
        (HANG, [Q], [Q]),
        (HANG, [G0], [G0]),
        (HANG, [T1, S1], [T1, S1]),  # two at once: both, in the job's order
        (HANG, [], []),  # everyone answers: no process named (the full rebuild runs)
        (CONTROLLER, [C], [C]),  # the controller's heartbeat named it and it does not answer
        (CONTROLLER, [], [C]),  # named by its heartbeat: killed even if it answered the probe since
        (CONTROLLER, [S0], [C, S0]),  # and a silent unit beside it
        (TRAINER, [], []),  # only the controller's own heartbeat kills an answering process
    ],
)
def test_hung_are_the_silent_ones(heartbeat: str, silent: list[JobActor], killed: list[JobActor]) -> None:
    answered = ids(*JOB) - ids(*silent)
    assert hung(JOB, answered, heartbeat) == killed


@pytest.mark.parametrize(
    ("gone", "restart", "keep", "controller_dead"),
    [
        ([], [], True, False),
        ([T1], ["trainer rank 1"], True, False),  # the rest keep their PIDs, the data plane is cleared in place
        ([G0], ["generation worker 0"], True, False),
        ([C], ["the controller actor"], True, True),  # the dead-controller path
        ([S0], list(DATA_PLANE), False, False),  # one unit gone: the whole data plane starts again
        ([Q], list(DATA_PLANE), False, False),
        ([T0, S1], ["trainer rank 0", *DATA_PLANE], False, False),
        ([C, G0], ["the controller actor", "generation worker 0"], True, True),
    ],
)
def test_scope_restarts_the_gone_and_resets_the_rest(
    gone: list[JobActor], restart: list[str], keep: bool, controller_dead: bool
) -> None:
    got = scope(JOB, ids(*gone))
    assert list(got.restart) == restart
    assert list(got.reset) == [a.name for a in JOB if a.name not in restart]
    assert (got.keep_data_plane, got.controller_dead) == (keep, controller_dead)


def test_a_killed_hung_process_is_scoped_like_a_dead_one() -> None:
    """The two halves together: what the probe kills is exactly what the reset starts again."""
    killed = hung(JOB, ids(*JOB) - ids(T1), HANG)
    assert scope(JOB, ids(*killed)) == scope(JOB, ids(T1))


def test_unfound_line_names_the_bound() -> None:
    assert "within 10s" in unfound_line(10.0) and "whole job is rebuilt" in unfound_line(10.0)
