"""Which of the job's actors died, and where — what the driver polls to notice a death that shows as a hang.

A dead trainer rank or controller actor surfaces as an error in the next call to it; a dead TransferQueue
controller does not (TransferQueue's client waits on its socket without a timeout), nor, for 200 s, does a dead
storage unit. So the driver asks Ray's GCS, once per poll, which of the actors it watches are ``DEAD``
(``JobActors.dead``), and ends the drive with ``ActorsDied`` naming them. The generation workers are not watched
here: the controller replaces a dead one itself (``sc_app.rl.worker_restart``). A hung process (alive, answering
nothing) is found by ``JobActors.probe`` once the driver's heartbeats stopped, and killed (``kill_hung``): it is a
``DeadActor`` (``hung=True``) from then on (``sc_app.attempt.restore_scope``).

``JobFailed`` is the family of "a process of the job died": the in-job restore (``sc_app.attempt.in_job_restore``)
recovers from it on the same cluster; past its bound, the attempt ends with exit 1 and a retry resumes from the
newest complete bundle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from sc_app.attempt.restore_scope import (  # what died, as a FaultRecord kind
    CONTROLLER,
    GENERATION,
    NODE,
    STORAGE,
    TQ_CONTROLLER,
    TRAINER,
    JobActor,
)
from sc_app.progress import JobFailed

log = logging.getLogger(__name__)

KIND_OF_CLASS = {  # an actor class a Ray error names → the kind of its death
    "TrainerWorker": TRAINER,
    "TrainerSpare": TRAINER,  # a spare that took a dead rank's place (sc_app.attempt.spares)
    "SimpleStorageUnit": STORAGE,
    "TransferQueueController": TQ_CONTROLLER,
    "SingleControllerActor": CONTROLLER,
    "GenerationWorker": GENERATION,
}


def kind_of_error(text: str) -> str | None:
    """The kind of death an error's text names (Ray's actor errors name the actor's class); None: it names none."""
    found = [(text.find(name), kind) for name, kind in KIND_OF_CLASS.items() if name in text]
    return min(found)[1] if found else None


@dataclass(frozen=True)
class DeadActor:
    kind: str  # TRAINER | STORAGE | TQ_CONTROLLER | CONTROLLER
    name: str  # e.g. "trainer rank 1", "TransferQueueStorageUnit#0"
    node_id: str
    node_alive: bool
    died_at: float | None  # time.time() of its death as the GCS recorded it (a hung one: when last heard from)
    actor_id: str = ""  # its Ray actor id (hex)
    hung: bool = False  # it did not die: it hung and the driver killed it (``JobActors.kill_hung``)


class ActorsDied(JobFailed):
    """Watched actors of the job are dead (``dead``); ``kind`` is ``node`` when one of their nodes is gone."""

    def __init__(self, dead: list[DeadActor]) -> None:
        self.dead = dead
        names = ", ".join(d.name for d in dead)
        where = " (their node is gone)" if self.kind == NODE else ""
        super().__init__(f"{names} died{where}")

    @property
    def kind(self) -> str:
        return NODE if any(not d.node_alive for d in self.dead) else self.dead[0].kind


def is_actor_death(exc: BaseException) -> bool:
    """``exc`` says an actor the caller used died (itself, or as the cause of a task error)."""
    if isinstance(exc, ray.exceptions.RayActorError):
        return True
    return isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, ray.exceptions.RayActorError)


class JobActors:
    """The actors one setup of the job placed that the driver watches (actor id hex → kind, name), and the handles
    of every process of the job (the generation workers too: probed for a hang, not watched for a death)."""

    def __init__(self, watched: dict[str, tuple[str, str]], handles: dict[str, tuple[JobActor, Any]] | None = None):
        self.watched = watched
        self.handles = handles or {}
        self._job_id = ray.JobID.from_hex(ray.get_runtime_context().get_job_id())

    @classmethod
    def of(cls, trainers: list[Any], controller: Any, generators: Sequence[Any] = ()) -> JobActors:
        """The trainers, the controller actor and TransferQueue's controller and storage units of this process."""
        from transfer_queue import interface as tq_interface  # set by tq_lifecycle.start or tq.init here

        named = [(t, TRAINER, f"trainer rank {rank}") for rank, t in enumerate(trainers)]
        named.append((controller, CONTROLLER, "the controller actor"))
        if tq_interface._TQ_CONTROLLER is not None:
            named.append((tq_interface._TQ_CONTROLLER, TQ_CONTROLLER, "the TransferQueue controller"))
        for name, unit in (tq_interface._TQ_STORAGE or {}).get("SimpleStorage", {}).items():
            named.append((unit, STORAGE, str(name)))
        watched = {actor_id(h): (kind, name) for h, kind, name in named}
        named += [(g, GENERATION, f"generation worker {i}") for i, g in enumerate(generators)]
        return cls(watched, {actor_id(h): (JobActor(actor_id(h), kind, name), h) for h, kind, name in named})

    @property
    def actors(self) -> list[JobActor]:
        """Every process of the job, in order: trainer ranks, the controller actor, TransferQueue, generation."""
        return [actor for actor, _ in self.handles.values()]

    def probe(self, seconds: float) -> set[str]:
        """The ids of the processes that answer one trivial call within ``seconds`` (all asked at once), or whose
        call failed (dead: the GCS says so). A trainer rank is asked on its "control" thread — its training thread
        may wait on another process — every other process on its only one."""
        refs: dict[str, Any] = {}
        for aid, (actor, handle) in self.handles.items():
            method = handle.alive if actor.kind == TRAINER else handle.__ray_ready__
            refs[aid] = method.remote()
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=seconds) if refs else ([], [])
        done = set(ready)
        return {aid for aid, ref in refs.items() if ref in done}

    def kill_hung(self, hung: list[JobActor], since: float | None) -> list[DeadActor]:
        """``ray.kill`` each hung actor (it ends a stopped process too) and name it as a death: from here on a hung
        process is a dead one."""
        out = []
        for actor in hung:
            try:
                ray.kill(self.handles[actor.actor_id][1], no_restart=True)
            except Exception:  # gone already: the GCS reports it as dead
                log.debug("killing hung %s failed", actor.name, exc_info=True)
            out.append(DeadActor(actor.kind, actor.name, "", True, since, actor.actor_id, hung=True))
            log.warning("%s hung: killed, to be started again like a dead process", actor.name)
        return out

    def dead(self) -> list[DeadActor]:
        """The watched actors the GCS lists as dead, in the order they were watched."""
        from ray._private import state  # the GCS tables without the dashboard (embedded Ray runs without one)

        table = state.actors(job_id=self._job_id, actor_state_name="DEAD")
        gone = [aid for aid in self.watched if aid in table]
        if not gone:
            return []
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        out = []
        for aid in gone:
            info, (kind, name) = table[aid], self.watched[aid]
            node = str(info.get("Address", {}).get("NodeID", ""))
            end_ms = info.get("EndTime") or 0
            out.append(DeadActor(kind, name, node, node in alive, end_ms / 1000 if end_ms else None, aid))
        return out

    def check(self) -> None:
        """Raise ``ActorsDied`` when a watched actor is dead."""
        dead = self.dead()
        if dead:
            raise ActorsDied(dead)

    def wait_dead(self, seconds: float) -> list[DeadActor]:
        """The dead watched actors, waiting up to ``seconds`` for the GCS to record a death that surfaced as an
        error first (a call fails as soon as the worker's connection drops)."""
        deadline = time.monotonic() + seconds
        while True:
            dead = self.dead()
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)


def live_node_resources() -> list[dict[str, float]]:
    """The total resources of every live node of the cluster."""
    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def actor_id(handle: Any) -> str:
    """An actor handle's id (hex): the same for every handle of one actor, another for its successor."""
    return str(handle._actor_id.hex())
