"""Spare trainer ranks (``trainer.spare_ranks``): after a trainer rank's death, a warm in-job restore gives its place
to a spare whose process was started and warmed up while the job trained, instead of starting a process then
(issue 29; ``docs/recovery.md``). What a new rank pays before it can load a bundle — its process, the imports of
torch and the backend, the first model and optimizer build (``torch._dynamo``), on a GPU the CUDA context — is paid
before the fault, at the price of a trainer rank's resources held idle.

Invariants:
* a spare is handed out only once its warm-up has finished and the GCS does not list it dead; one still warming up
  (or not placed yet) is never waited for — a new rank is started instead — so a spare starved of CPU can cost a
  restore nothing; one whose warm-up failed is killed and dropped;
* a spare is no part of the job: nothing watches it, its death ends nothing, it holds no rank until ``take_rank``;
  its warm-up runs at the lowest priority (nice 19, below Ray's workers), so it slows neither training nor a
  restore much while it lasts;
* before the job's actors are started again — a warm reset, a full rebuild — every spare not placed on a node yet is
  killed: pending, it would compete with them for the resources the death freed;
* after each set-up and each warm reset the pool is filled again (its new spares start while the job trains on),
  so the next death finds one too; the pool outlives a full rebuild's teardown and is killed with the attempt.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray

from sc_app.config.app import AppConfig

log = logging.getLogger(__name__)


@dataclass
class Spare:
    handle: Any  # a TrainerSpare actor
    ready: Any  # the ObjectRef of its warm_up (its pid)


@dataclass
class Taken:
    """A spare handed out: its handle and its process (as the GCS names it)."""

    handle: Any
    pid: int


class Spares:
    """The attempt's pool of spare trainer ranks (the module docstring)."""

    def __init__(self, cfg: AppConfig) -> None:
        self.cfg = cfg
        self.pool: list[Spare] = []

    def fill(self) -> None:
        """Start spares until the pool holds ``trainer.spare_ranks`` (each warms up on its own)."""
        want = self.cfg.trainer.spare_ranks - len(self.pool)
        if want <= 0:
            return
        from sc_app.rl.trainer import TrainerSpare

        t, cfg_json = self.cfg.trainer, self.cfg.model_dump_json()
        for _ in range(want):
            handle = TrainerSpare.options(
                num_cpus=t.num_cpus, num_gpus=t.num_gpus, resources=t.resources or None
            ).remote(cfg_json, t.num_workers)
            self.pool.append(Spare(handle, handle.warm_up.remote()))
        log.info("starting %d spare trainer rank(s)", want)

    def take(self) -> Taken | None:
        """A warmed-up spare out of the pool (the module docstring); None when none is. Dead ones are dropped."""
        for spare in list(self.pool):
            state, pid = gcs_state(spare.handle)
            if state == "DEAD":
                self.pool.remove(spare)
                log.info("a spare trainer rank died (its node gone?); dropped")
                continue
            if not ray.wait([spare.ready], timeout=0)[0]:
                continue  # still warming up, or not placed: never waited for
            self.pool.remove(spare)
            try:
                ray.get(spare.ready, timeout=5)
            except Exception as exc:
                log.warning("a spare trainer rank failed its warm-up (%s); dropped", str(exc).splitlines()[0][:200])
                _kill(spare.handle)
                continue
            return Taken(spare.handle, pid)
        return None

    def drop_unplaced(self) -> None:
        """Kill every spare no node holds yet (the module docstring: before actors start again)."""
        pending = [s for s in self.pool if not gcs_state(s.handle)[1]]
        for spare in pending:
            self.pool.remove(spare)
            _kill(spare.handle)
        if pending:
            log.info(
                "%d spare trainer rank(s) not placed yet: killed before the job's actors start again", len(pending)
            )

    def close(self) -> None:
        """Kill every spare (the attempt ends)."""
        for spare in self.pool:
            _kill(spare.handle)
        self.pool = []


def gcs_state(handle: Any) -> tuple[str, int]:
    """The GCS's state of the spare and the pid of the process that holds it (0: no node holds it yet)."""
    from ray._private import state

    from sc_app.attempt.actor_watch import actor_id

    found = state.actors(actor_id=actor_id(handle)) or {}
    return str(found.get("State", "")), int(found.get("Pid") or 0)


def _kill(handle: Any) -> None:
    try:
        ray.kill(handle)
    except Exception:  # already dead
        log.debug("killing a spare trainer rank failed", exc_info=True)
