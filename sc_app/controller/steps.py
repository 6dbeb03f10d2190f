"""What the controller reports of one train step: its ``StepRecord``, the rollout pumps' seconds charged to it, and
the copy trainer rank 0 keeps of it."""

from __future__ import annotations

from typing import Any

import torch

from sc_app.data_plane.replay_buffer import BufferTimes
from sc_app.phases import StepClock
from sc_app.progress import StepRecord
from sc_app.rl.backend import TrainStepResult


def step_record(
    clock: StepClock,
    reward: torch.Tensor,
    results: list[TrainStepResult],
    staleness: float,
    controller: Any,
) -> StepRecord:
    """The step ``controller`` (a ``SingleControllerActor``) just trained; drains its barrier's commit waits."""
    step, version, rows_held, barrier = controller.step, controller.version, controller.buffer.rows, controller.barrier
    step_seconds, phases = clock.finish()
    return StepRecord(
        step=step,
        reward=float(reward.mean()),
        loss=sum(r.loss for r in results) / len(results),
        staleness=staleness,
        rows_held=rows_held,
        step_seconds=step_seconds,
        reward_min=float(reward.min()),
        reward_max=float(reward.max()),
        weights_version=version,
        commit_waits=barrier.stats.drain_mutation_waits(),
        phase_seconds=phases,
    )


def rollout_phases(
    clock: StepClock, mark: tuple[BufferTimes, float], times: BufferTimes, generation: float
) -> tuple[BufferTimes, float]:
    """Charge the rollout pumps' generate and commit seconds since ``mark`` to the step; returns the new mark."""
    clock.add("generation", generation - mark[1])
    clock.add("put", times.put - mark[0].put)
    clock.add("put_barrier_wait", times.put_wait - mark[0].put_wait)
    return times, generation


def keep_with_trainer(trainers: list[Any], record: StepRecord) -> None:
    """Hand ``record`` to trainer rank 0 as well (no wait: ordered after the step's own call there), so that the
    steps a controller trained but the driver had not polled yet survive the controller's death."""
    keep = getattr(trainers[0], "keep_progress", None) if trainers else None  # in-process fakes have none
    if keep is not None:
        keep.remote(record)
