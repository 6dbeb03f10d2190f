"""Replace a dead generation worker in the same job (issue 18 part 2; ``docs/recovery.md``).

A rollout pump's generate call that fails because its worker actor died (OOM, a killed process, a drained node)
does not end the run. ``GenerationSupervisor.generate``:

1. hands the call's prompts back to the loader (``PromptLoader.give_back``: re-issued first, exactly once — a
   prompt that is not pending any more is not given back again), so none is lost and none is trained twice;
2. starts a new ``GenerationWorker`` with the same index and the same resources (``generation.num_cpus``,
   ``num_gpus``, ``resources``: the placement the driver asked for), runs its ``setup`` (the dataset check) and
   gives it the trainers' current weights and version *before* it is put in the worker list, so its first generate
   call uses them; if training published a newer version meanwhile, that one is sent too;
3. reports a ``FaultRecord`` (kind ``generation.worker``: detection and recovery seconds, rollouts regenerated).

A replacement that dies while it starts (or while it takes its first weights) is one more death of that worker:
its own ``fault`` event, counted against the same budget, and another replacement — never a pump failure.
Every call carries the controller's fencing ``epoch`` (``sc_app.rl.fencing``), and a rollout stamped with another
epoch is refused (its prompts given back, counted in ``refused``): nothing from before a warm restore is committed.

``generation.max_restarts`` restarts per worker within ``generation.restart_window_s`` (``RestartBudget``, pure);
past it the pump stops with ``GenerationWorkerFailed``, one line naming the worker and the prompts of the failed
call — a prompt that kills every worker does not loop forever. Weights go through the weight-sync seam
(``sc_app.rl.weight_sync``): ``push_weights`` skips a worker that died (its pump replaces it with the current
weights).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sc_app.progress import FaultRecord, RecoveryExhausted
from sc_app.rl.weight_sync.push import PushResult, WeightSync

log = logging.getLogger(__name__)

START_TIMEOUT_S = 600.0  # how long a replacement worker may take to be placed and set up (model load included)


class GenerationWorkerFailed(RecoveryExhausted):
    """A generation worker died more often than ``generation.max_restarts`` allows."""


@dataclass
class RestartBudget:
    """At most ``max_restarts`` restarts of one worker within any ``window_s`` seconds. Pure."""

    max_restarts: int
    window_s: float
    _times: dict[int, deque[float]] = field(default_factory=dict)

    def allow(self, worker: int, now: float) -> bool:
        """Record a restart of ``worker`` at ``now`` if the budget allows it; False (nothing recorded) if not."""
        times = self._times.setdefault(worker, deque())
        while times and now - times[0] > self.window_s:
            times.popleft()
        if len(times) >= self.max_restarts:
            return False
        times.append(now)
        return True


class GenerationSupervisor:
    """The controller's generation workers, replaced in place when one dies (the module docstring)."""

    def __init__(
        self,
        *,
        cfg: Any,
        cfg_json: str,
        dataset_sha256: str | None,
        generators: list[Any],
        trainers: list[Any],
        version: Callable[[], int],
        step: Callable[[], int],
        give_back: Callable[[list[int]], Any],
        on_fault: Callable[[FaultRecord], None],
        trace: Callable[..., None],
        epoch: int | None = None,
    ) -> None:
        gen = cfg.generation
        self.cfg, self.cfg_json, self.dataset_sha256 = cfg, cfg_json, dataset_sha256
        self.generators, self.trainers = generators, trainers  # the controller's own lists: replaced in place
        self.weights = WeightSync(trainers)
        self.weights.epoch = self.epoch = epoch
        self.refused = 0  # rollouts of another epoch refused
        self.budget = RestartBudget(gen.max_restarts, gen.restart_window_s)
        self._version, self._step = version, step
        self._give_back, self._on_fault, self._trace = give_back, on_fault, trace
        self._group_size = cfg.grpo.group_size

    async def generate(self, index: int, idxs: list[int]) -> Any | None:
        """Worker ``index``'s rollout of ``idxs``, or None when the worker died (its prompts went back to the
        loader and a new worker with the current weights took its place) or the rollout is of another epoch
        (refused, its prompts given back). ``GenerationWorkerFailed`` past the restart budget."""
        import ray

        started = time.perf_counter()
        fenced = () if self.epoch is None else (self.epoch,)
        try:
            out = await self.generators[index].generate.remote(idxs, *fenced)
        except ray.exceptions.RayActorError as exc:
            await self._give_back(idxs)
            self._trace(ev="give_back", prompts=idxs, worker=index)
            await self._recover(index, idxs, exc, started)
            return None
        if self.epoch is not None and getattr(out, "epoch", self.epoch) != self.epoch:
            self.refused += 1
            log.warning("refused a rollout of epoch %s (the controller is at %s)", out.epoch, self.epoch)
            await self._give_back(idxs)
            return None
        return out

    async def _recover(self, index: int, idxs: list[int], exc: BaseException, started: float) -> None:
        """Replace dead worker ``index`` (one fault event per death: a replacement that dies as it starts is
        another death, reported and replaced in turn, within the budget)."""
        import ray

        while True:
            detected = time.perf_counter()
            if not self.budget.allow(index, time.monotonic()):
                raise GenerationWorkerFailed(
                    f"generation worker {index} died more than generation.max_restarts="
                    f"{self.budget.max_restarts} times within {self.budget.window_s:g}s (last while generating "
                    f"prompts {idxs}, given back to the loader); check the worker's logs for OOM or a poisoned prompt"
                ) from None
            log.warning("generation worker %d died (%s); replacing it", index, str(exc).splitlines()[0][:200])
            try:
                version = await self._replace(index)
            except ray.exceptions.RayActorError as again:  # the replacement died as it started
                self._report(index, idxs, exc, started, detected, outcome="replaced_again")
                exc, started = again, time.perf_counter()
                continue
            self._trace(ev="generation_restart", worker=index, version=version)
            self._report(index, idxs, exc, started, detected, outcome="recovered")
            return

    def _report(
        self, index: int, idxs: list[int], exc: BaseException, started: float, detected: float, *, outcome: str
    ) -> None:
        self._on_fault(
            FaultRecord(
                step=self._step(),
                kind="generation.worker",
                outcome="recovered",
                attempts=1,
                detection_seconds=detected - started,
                recovery_seconds=time.perf_counter() - detected,
                rollouts_regenerated=len(idxs) * self._group_size if outcome == "recovered" else 0,
                error=f"worker {index}: {type(exc).__name__}"
                + ("" if outcome == "recovered" else " (its replacement died as it started: replaced again)"),
            )
        )

    async def _replace(self, index: int) -> int:
        """A new worker for slot ``index`` holding the current weights; returns the version it holds."""
        import ray

        from sc_app.rl.generation import GenerationWorker

        gen = self.cfg.generation
        worker = GenerationWorker.options(
            num_cpus=gen.num_cpus, num_gpus=gen.num_gpus, resources=gen.resources or None
        ).remote(self.cfg_json, index)
        try:  # a replacement the cluster has no room for would wait forever: bounded, then one line
            await asyncio.wait_for(asyncio.ensure_future(worker.setup.remote(self.dataset_sha256)), START_TIMEOUT_S)
            if self.epoch is not None:
                await worker.reset.remote(self.epoch)  # fenced from its first call
        except TimeoutError:
            ray.kill(worker)
            raise GenerationWorkerFailed(
                f"generation worker {index} died and its replacement did not start within {START_TIMEOUT_S:g}s "
                f"(it needs num_cpus={gen.num_cpus:g}, num_gpus={gen.num_gpus:g}, resources={gen.resources or {}}: "
                "is a node gone?)"
            ) from None
        sent = self._version()
        while self.weights.is_stale(worker, sent):  # a newer version published meanwhile is sent too
            await self.weights.push([worker], sent)  # any error, its death included, ends the pump
            sent = self._version()
        self.weights.forget(self.generators[index])
        self.generators[index] = worker  # from here on weight syncs reach it
        return sent

    async def push_weights(self, version: int) -> PushResult:
        """``version`` to every worker (rank 0's ``get_weights`` result, every trainer rank taking part); a worker
        that died is skipped — its pump gives its replacement the current weights."""
        return await self.weights.push(self.generators, version, skip_dead=True)
