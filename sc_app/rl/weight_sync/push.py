"""Pushing one weights version to generation workers: the control path of every transport, written once.

Every trainer rank's ``get_weights`` is issued first (collective where the model is sharded; ranks other than 0
return None), then each worker's ``set_weights(rank 0's result, version)``: one Ray object per version, whatever the
transport put in it, read by every worker. The other ranks' calls are awaited too (their part of the gather).

Callers: set-up's first sync (``push_blocking``, after the restore is sealed and before the controller exists), the
controller's per-step sync (``push(skip_dead=True)``: a worker that died is skipped, its rollout pump replaces it)
and a replacement worker's sync (``push`` to that worker alone, while ``is_stale``, before it joins the list).
``WeightSync`` records the version each worker acknowledged; only ``RayActorError`` counts as a dead worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PushResult:
    version: int
    reached: int  # workers that hold ``version`` now
    skipped: tuple[int, ...] = ()  # positions (in the list pushed to) of dead workers that were skipped


def _is_dead(exc: BaseException) -> bool:
    import ray

    return isinstance(exc, ray.exceptions.RayActorError)


class WeightSync:
    """Weights versions from ``trainers`` (the caller's list) to generation workers (actor handles, or anything
    reached as ``handle.method.remote(...)``)."""

    def __init__(self, trainers: Sequence[Any]) -> None:
        self.trainers = trainers
        self._held: dict[Any, int] = {}  # worker handle → the version it acknowledged last
        self.epoch: int | None = None  # the fencing epoch each set_weights carries (sc_app.rl.fencing); None: none

    def held(self, worker: Any) -> int | None:
        """The version ``worker`` holds, as far as a push through this object knows (None: never pushed to)."""
        return self._held.get(worker)

    def is_stale(self, worker: Any, version: int) -> bool:
        return self._held.get(worker) != version

    def forget(self, worker: Any) -> None:
        """``worker`` is gone (replaced): drop what was recorded of it."""
        self._held.pop(worker, None)

    def _issue(self, workers: Sequence[Any], version: int) -> tuple[list[Any], list[Any]]:
        """Every trainer rank's ``get_weights``, then each worker's ``set_weights`` of rank 0's result; returns
        (the workers' calls, the other ranks' calls)."""
        refs = [t.get_weights.remote() for t in self.trainers]
        fenced = () if self.epoch is None else (self.epoch,)
        return [w.set_weights.remote(refs[0], version, *fenced) for w in workers], refs[1:]

    def push_blocking(
        self, workers: Sequence[Any], version: int, get: Callable[[list[Any]], Any] | None = None
    ) -> PushResult:
        """``version`` to every worker of ``workers``, waiting with ``get`` (default ``ray.get``) on every call; any
        error, a dead worker's included, is raised."""
        if get is None:
            import ray

            get = ray.get
        calls, others = self._issue(workers, version)
        get(calls + others)
        for worker in workers:
            self._held[worker] = version
        return PushResult(version, len(workers))

    async def push(self, workers: Sequence[Any], version: int, *, skip_dead: bool = False) -> PushResult:
        """``version`` to every worker of ``workers`` (the list as it is now). With ``skip_dead`` a worker that died
        is skipped (and forgotten); any other error is raised once every call has ended."""
        workers = list(workers)
        calls, others = self._issue(workers, version)
        results = await asyncio.gather(*calls, return_exceptions=True)
        await asyncio.gather(*others)
        skipped = []
        for i, (worker, res) in enumerate(zip(workers, results, strict=True)):
            if not isinstance(res, BaseException):
                self._held[worker] = version
            elif skip_dead and _is_dead(res):
                skipped.append(i)
                self.forget(worker)
        for res in results:
            if isinstance(res, BaseException) and not (skip_dead and _is_dead(res)):
                raise res
        return PushResult(version, len(workers) - len(skipped), tuple(skipped))
