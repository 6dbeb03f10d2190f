"""Which of the job's processes an in-job restore kills, starts again and keeps (issues 29 and 31 A). Pure.

A hung process (alive but answering nothing: SIGSTOPped, deadlocked, on a frozen node) is treated exactly like a
dead one. When the driver's heartbeats end the drive (``ProcessHung``), every process of the job is asked to answer
one trivial call (``actor_watch.JobActors.probe``); ``hung`` picks the ones to ``ray.kill`` — those that did not
answer within the probe's bound, and the controller actor whenever its own heartbeat named it. From then on they
are dead: ``scope`` gives the warm reset the same answer as for a death the GCS reported — the dead and the killed
start again, every other process is reset in place (its PID kept). The data plane is all or nothing: one storage
unit or TransferQueue's controller gone and the whole data plane is started again; else it is kept and cleared.

A hang that names no process (every one answered the probe: the silent one is busy inside, or the hang is gone) is
not guessed at: the restore rebuilds the whole job (``unfound_line``), which kills whatever hangs with it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

# what died or hung, as a FaultRecord kind
TRAINER, STORAGE, TQ_CONTROLLER, CONTROLLER, NODE, GENERATION = (
    "trainer.worker",
    "data_plane.storage",
    "data_plane.controller",
    "controller",
    "node",
    "generation.worker",
)
DATA_PLANE = (STORAGE, TQ_CONTROLLER)


@dataclass(frozen=True)
class JobActor:
    """One process of the job: its Ray actor id (hex), kind, and name in the lines (e.g. ``trainer rank 1``)."""

    actor_id: str
    kind: str
    name: str


def hung(actors: Sequence[JobActor], answered: Collection[str], heartbeat_kind: str) -> list[JobActor]:
    """The actors to kill as hung, in ``actors``' order: those whose id is not in ``answered`` (the probe's answers;
    an actor whose call failed — it is dead — counts as answered: the GCS reports it), and the controller actor when
    its own heartbeat (``heartbeat_kind``) named it even if it answered the probe since."""
    return [a for a in actors if a.actor_id not in answered or (a.kind == CONTROLLER == heartbeat_kind)]


@dataclass(frozen=True)
class Scope:
    """What a warm reset does to each process (names, in the job's order)."""

    restart: tuple[str, ...]  # dead or killed: started again
    reset: tuple[str, ...]  # alive: reset in place, PID kept
    keep_data_plane: bool  # every TransferQueue actor lives: cleared and refilled, not started again
    controller_dead: bool  # the controller actor is started again (its last steps come from trainer rank 0)


def scope(actors: Sequence[JobActor], gone: Collection[str]) -> Scope:
    """The warm reset's scope when the actors whose ids are in ``gone`` (dead, or killed as hung) are gone."""
    lost = [a for a in actors if a.actor_id in gone]
    keep = not any(a.kind in DATA_PLANE for a in lost)
    restart = [a.name for a in actors if a.actor_id in gone or (a.kind in DATA_PLANE and not keep)]
    reset = [a.name for a in actors if a.name not in restart]
    return Scope(tuple(restart), tuple(reset), keep, any(a.kind == CONTROLLER for a in lost))


def unfound_line(seconds: float) -> str:
    """Why a hang's restore rebuilds the whole job: the probe found no process that does not answer."""
    return (
        f"every process of the job answered within {seconds:g}s, so the hung one is not known: the whole job is "
        "rebuilt (which kills it with the rest)"
    )
