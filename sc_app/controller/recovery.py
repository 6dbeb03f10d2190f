"""The controller's in-job recovery (issue 18; ``docs/recovery.md``): ``InJobRecovery``.

It wraps the controller's data-plane client in ``RetryingClient`` (failed calls retried with bounded backoff, a
failed put's rows removed, every fault a ``FaultRecord``), owns the ``GenerationSupervisor`` the rollout pumps
generate through (a dead generation worker is replaced in-job, its prompts handed back through the controller's
``give_back``) and sends each weights version through it (a dead worker is skipped). ``rollout_failure`` is what
the sampler raises when a rollout pump stopped: a spent recovery (``RecoveryExhausted``) keeps its own one line.

The controller's moving state (its step and weights version) is read through the callables it passes; nothing
here writes controller state.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sc_app.config.app import AppConfig
from sc_app.data_plane.client import DataPlaneClient
from sc_app.data_plane.retry import DataPlaneFault, RetryingClient, policy_of
from sc_app.progress import ProgressRecord, RecoveryExhausted
from sc_app.rl.hooks import typed_failure
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


def log_rollout_failure(worker_index: int, exc: BaseException) -> None:
    """A rollout pump ended with ``exc``: one line for a reward or input error, else with its traceback."""
    if (typed := typed_failure(exc)) is not None:
        log.error("rollout pump %d: %s", worker_index, typed)
    else:
        log.error("rollout pump %d failed", worker_index, exc_info=exc)


class RecoveryArgs(Protocol):
    """What recovery reads of ``SingleControllerActorArgs`` (``generators`` is replaced in place)."""

    cfg_json: str
    dataset: dict[str, Any] | None
    generators: list[Any]
    trainers: list[Any]
    epoch: int | None


class InJobRecovery:
    """The controller's in-job recovery (the module docstring). ``report`` receives every fault record in order."""

    def __init__(
        self,
        cfg: AppConfig,
        args: RecoveryArgs,
        *,
        step: Callable[[], int],
        version: Callable[[], int],
        give_back: Callable[[list[int]], Awaitable[None]],
        report: Callable[[ProgressRecord], None],
        trace: Callable[..., None],
    ) -> None:
        self.cfg, self.args = cfg, args
        self._step, self._version = step, version
        self._give_back, self._report, self._trace = give_back, report, trace
        self._generation = self._supervise_generation()

    @property
    def version(self) -> int:
        """The controller's weights version now."""
        return self._version()

    @property
    def generation(self) -> GenerationSupervisor:
        """What the rollout pumps generate through (a dead worker is replaced in place)."""
        return self._generation

    def with_retries(self, client: DataPlaneClient) -> RetryingClient:
        """``client`` with in-job recovery of failed calls (``data_plane.retries``, ``retry_backoff_s``)."""
        dp = self.cfg.data_plane
        return RetryingClient(client, policy_of(dp.retries, dp.retry_backoff_s), on_fault=self._data_plane_fault)

    def _data_plane_fault(self, fault: DataPlaneFault) -> None:
        self._report(fault.record(self._step()))

    def _supervise_generation(self) -> GenerationSupervisor:
        """The supervisor of ``args.generators`` (replaced in place in that list when a worker dies)."""
        return GenerationSupervisor(
            cfg=self.cfg,
            cfg_json=self.args.cfg_json,
            dataset_sha256=(self.args.dataset or {}).get("sha256"),
            generators=self.args.generators,
            trainers=self.args.trainers,
            version=self._version,
            step=self._step,
            give_back=self._give_back,
            on_fault=self._report,
            trace=self._trace,
            epoch=self.args.epoch,
        )

    async def sync_weights(self) -> None:
        """The new version to every generation worker through the weight-sync seam (``sc_app.rl.weight_sync``);
        a dead worker is skipped (its pump gives its replacement the current weights)."""
        await self._generation.push_weights(self.version)
