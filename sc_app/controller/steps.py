"""What the controller reports of one train step: its ``StepRecord`` and the rollout pumps' seconds charged to it."""

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
