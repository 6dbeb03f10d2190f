"""The controller in process (no Ray) for the controller's tests: fake workers (``tests/support/fake_workers.py``)
and the in-memory data plane, a deadline on every test coroutine, a group committed as a rollout pump commits one."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import torch
from tensordict import TensorDict

from sc_app.config.app import AppConfig
from sc_app.controller.actor import SingleControllerActor, SingleControllerActorArgs
from sc_app.data_plane.replay_buffer import GroupCommit
from tests.support.fake_data_plane import FakeDataPlane
from tests.support.fake_workers import FakeGenerator, FakeTrainer

G = 4  # rows per group
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
    """A test coroutine with a deadline: a deadlock fails instead of hanging the suite."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def make_controller(
    tmp_path: Path, *, max_steps: int = 5, save_period: int = 0, trainers: int = 1, generators: int = 2, **grpo: Any
) -> tuple[SingleControllerActor, FakeDataPlane]:
    cfg = AppConfig.model_validate(
        {
            "run": {"max_steps": max_steps},
            "grpo": {"prompts_per_step": 2, "group_size": G, "max_groups_buffered": 6, **grpo},
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "enabled": save_period > 0, "save_period": save_period or 1},
        }
    )
    args = SingleControllerActorArgs(
        cfg_json=cfg.model_dump_json(),
        run_id="run-test",
        trainers=[FakeTrainer(rank) for rank in range(trainers)],
        generators=[FakeGenerator(G) for _ in range(generators)],
    )
    client = FakeDataPlane()
    controller = SingleControllerActor(args, connect=lambda cfg: client)
    client.barrier = controller.barrier
    return controller, client


async def commit(controller: SingleControllerActor, prompt: int, version: int) -> None:
    data = TensorDict({"reward": torch.arange(G, dtype=torch.float32), "tokens": torch.zeros(G, 3)}, [G])
    await controller.buffer.commit_groups([GroupCommit(f"p{prompt}", prompt, version)], data)
