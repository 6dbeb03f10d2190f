"""The in-job recovery half of the controller (issue 18; ``docs/recovery.md``).

``ControllerRecovery`` is a mixin of ``SingleControllerActor`` (like ``controller_saves``): it wraps the controller's
data-plane client in ``RetryingClient`` (failed calls retried with bounded backoff, a failed put's rows removed,
every fault a ``FaultRecord``), builds the ``GenerationSupervisor`` the rollout pumps generate through (a dead
generation worker is replaced in-job), sends each weights version through it (a dead worker is skipped) and takes a
dead worker's prompts back. ``rollout_failure`` is what the sampler raises when a rollout pump stopped: a spent
recovery (``RecoveryExhausted``) keeps its own one line.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sc_app.config.app import AppConfig
from sc_app.data_plane.client import DataPlaneClient
from sc_app.data_plane.retry import DataPlaneFault, RetryingClient, policy_of
from sc_app.progress import ProgressRecord, RecoveryExhausted
from sc_app.rl.hooks import typed_failure
from sc_app.rl.loader import PromptLoader
from sc_app.rl.worker_restart import GenerationSupervisor

log = logging.getLogger(__name__)


def rollout_failure(exc: BaseException) -> BaseException:
    """The error that ends the run when a rollout pump failed with ``exc``: a reward or input error (its one line
    names the function, not "pump failed") or a spent recovery as itself, anything else as a defect."""
    if isinstance(exc, RecoveryExhausted):
        return exc
    if (typed := typed_failure(exc)) is not None:
        return typed
    failure = RuntimeError("rollout pump failed")
    failure.__cause__ = exc
    return failure


class ControllerRecovery:
    """The recovery half of ``SingleControllerActor``; these attributes are the controller's."""

    args: Any  # SingleControllerActorArgs
    cfg: AppConfig
    loader: PromptLoader
    step: int
    version: int
    _progress: list[ProgressRecord]
    _cond: asyncio.Condition
    _inflight: int
    _rollout_error: BaseException | None
    _generation: GenerationSupervisor

    def _trace(self, **event: Any) -> None:
        raise NotImplementedError  # the controller's

    def _with_retries(self, client: DataPlaneClient) -> RetryingClient:
        """``client`` with in-job recovery of failed calls (``data_plane.retries``, ``retry_backoff_s``)."""
        dp = self.cfg.data_plane
        return RetryingClient(client, policy_of(dp.retries, dp.retry_backoff_s), on_fault=self._data_plane_fault)

    def _data_plane_fault(self, fault: DataPlaneFault) -> None:
        self._progress.append(fault.record(self.step))

    def _supervise_generation(self) -> GenerationSupervisor:
        """The supervisor of ``args.generators`` (replaced in place in that list when a worker dies)."""
        return GenerationSupervisor(
            cfg=self.cfg,
            cfg_json=self.args.cfg_json,
            dataset_sha256=(self.args.dataset or {}).get("sha256"),
            generators=self.args.generators,
            trainers=self.args.trainers,
            version=lambda: self.version,
            step=lambda: self.step,
            give_back=self._give_back,
            on_fault=self._progress.append,
            trace=self._trace,
        )

    async def _give_back(self, idxs: list[int]) -> None:
        """A dead worker's prompts: back to the loader (re-issued first, once), out of the in-flight count."""
        back = self.loader.give_back(idxs)
        async with self._cond:
            self._inflight = max(0, self._inflight - len(back))
            self._cond.notify_all()

    async def _sync_weights(self) -> None:
        """The new version to every generation worker through the weight-sync seam (``sc_app.rl.weight_sync``);
        a dead worker is skipped."""
        await self._generation.push_weights(self.version)

    async def _rollout_failed(self, worker_index: int, exc: BaseException) -> None:
        """A rollout pump ended with ``exc``: logged (one line for a reward or input error, else with its
        traceback) and kept for the sampler, which ends the run with ``rollout_failure(exc)``."""
        if (typed := typed_failure(exc)) is not None:
            log.error("rollout pump %d: %s", worker_index, typed)
        else:
            log.error("rollout pump %d failed", worker_index, exc_info=exc)
        self._rollout_error = exc
        async with self._cond:
            self._cond.notify_all()
