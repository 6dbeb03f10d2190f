"""SingleControllerActor in process (no Ray): the pumps, the sampler's staleness window and the save's capture,
against fake workers (``tests/support/fake_workers.py``) and the in-memory data plane."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from tensordict import TensorDict

from sc_app.checkpoint import BundleWriter
from sc_app.config.app import AppConfig
from sc_app.controller.actor import InventoryMismatch, SingleControllerActor, SingleControllerActorArgs, _StopNow
from sc_app.data_plane.replay_buffer import GroupCommit
from sc_app.progress import SaveRecord, StepRecord
from tests.support.fake_data_plane import FakeDataPlane, until
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


def test_the_pumps_train_to_max_steps_on_fresh_groups_and_sync_every_version(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, max_steps=5, trainers=2)

    async def body() -> Any:
        assert await controller.restore() == 0
        return await controller.run()

    summary = run(body())
    assert summary.final_step == 5 and summary.weights_version == 5 and not summary.stopped_early
    steps = [r for r in controller.progress(0) if isinstance(r, StepRecord)]
    assert [r.step for r in steps] == [1, 2, 3, 4, 5]
    assert all(0 <= r.staleness <= 1 for r in steps), "a group outside the staleness window was trained"
    assert all((r.reward, r.reward_min, r.reward_max) == (0.5, 0.0, 1.0) for r in steps)  # rows' rewards 0, 1, 0, 1
    for trainer in controller.args.trainers:  # every trainer saw every step, in version order, 2 groups of G rows
        calls = trainer.called("train_step")
        assert [version for _, version, _ in calls] == [1, 2, 3, 4, 5]
        assert all(len(ids) == 2 * G for ids, _, _ in calls)
    trained = [sid for ids, _, _ in controller.args.trainers[0].called("train_step") for sid in ids]
    assert len(trained) == len(set(trained)), "a row was trained twice"
    assert not set(trained) & set(client.rows), "trained groups are dropped from the data plane"
    assert set(client.rows) == controller.buffer.sample_ids(), "the data plane holds exactly the index's rows"
    for generator in controller.args.generators:
        assert generator.called("set_weights") == [1, 2, 3, 4, 5]
    assert client.calls.count("get_samples") == 5, "the advantage stage reads each step's rows back once"


def test_the_sampler_drops_groups_outside_the_staleness_window(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, max_staleness=1)

    async def body() -> list[str]:
        await controller.restore()
        for prompt, version in enumerate([0, 1, 2, 3]):
            await commit(controller, prompt, version)
        controller.version = 3  # groups of versions 0 and 1 are more than 1 version old
        return [g.group_id for g in await controller._sample(2)]

    assert run(body()) == ["p2", "p3"]
    assert sorted(g.group_id for g in controller.buffer.groups()) == ["p2", "p3"]
    assert set(client.rows) == {f"p{p}:{r}" for p in (2, 3) for r in range(G)}, "stale rows are cleared"


def test_the_sampler_waits_for_enough_fresh_groups_until_a_stop(tmp_path: Path) -> None:
    controller, _ = make_controller(tmp_path)

    async def body() -> None:
        await controller.restore()
        await commit(controller, 0, 0)
        sampling = asyncio.create_task(controller._sample(2))
        await asyncio.sleep(0)
        await controller.request_stop()
        with pytest.raises(_StopNow):  # it was waiting: one fresh group is not a batch of two
            await sampling
        await commit(controller, 1, 0)
        assert len(await controller._sample(2)) == 2

    run(body())


def test_capture_fixes_index_loader_and_rows_in_the_window_then_freezes_them(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, save_period=10)

    async def body() -> Any:
        await controller.restore()
        for prompt in range(3):
            controller.loader.take()
            await commit(controller, prompt, 0)
            controller.loader.settled(prompt)
        controller.loader.take()  # taken, not committed: the loader place lists it for reissue
        writer = BundleWriter(str(tmp_path / "ckpt"), controller.step, hmac_key=None, lease=None)
        client.calls.clear()
        return await controller._capture(writer)

    captured, snapshot, window = run(body())
    assert controller.args.trainers[0].called("capture_state") == [0], "the trainer's state is copied for the save"
    assert captured.replay_index == controller.buffer.metadata_state_dict()
    assert captured.loader_state == {"schema_version": 1, "next_index": 4, "reissue": [3]}
    assert set(snapshot.rows) == controller.buffer.sample_ids() and len(snapshot.rows) == 3 * G
    assert snapshot.metadata["digest"] == captured.digest
    assert client.calls == ["list_sample_ids", "save_checkpoint"], "the index is checked against the rows first"
    assert controller.buffer.frozen and window >= 0
    assert not controller.barrier.checkpoint_held


def test_capture_refuses_rows_the_index_does_not_list_and_releases_the_window(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, save_period=10)

    async def body() -> None:
        await controller.restore()
        await commit(controller, 0, 0)
        client.rows["stray:0"] = {"reward": torch.zeros(())}
        controller._captured_version = controller.version
        writer = BundleWriter(str(tmp_path / "ckpt"), controller.step, hmac_key=None, lease=None)
        with pytest.raises(InventoryMismatch):
            await controller._capture(writer)

    run(body())
    assert "save_checkpoint" not in client.calls
    assert not controller.barrier.checkpoint_held and not controller.buffer.frozen


def test_restore_refuses_a_data_plane_that_holds_rows_the_index_does_not(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path)
    client.rows["p9:0"] = {"reward": torch.zeros(())}
    with pytest.raises(InventoryMismatch):
        run(controller.restore())
    with pytest.raises(RuntimeError, match="before restore"):
        run(controller.run())


def test_saves_are_cut_at_their_steps_behind_training(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, max_steps=4, save_period=2)

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    summary = run(body())
    saves = [r for r in controller.progress(0) if isinstance(r, SaveRecord)]
    assert [r.step for r in saves] == [2, 4] and summary.last_saved_step == 4
    trainer = controller.args.trainers[0]
    assert [capture for _, _, capture in trainer.called("train_step")] == [False, True, False, True]
    assert trainer.called("capture_state") == [], "the copy was taken inside the steps the saves were due at"
    assert trainer.called("write_captured") == [2, 4]
    for step in (2, 4):
        bundle = tmp_path / "ckpt" / f"step_{step}"
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["step"] == step and "policy/rank0.bin" in manifest["files"]
    assert [len(s.rows) for s in client.snapshots] == [r.groups * G for r in saves]
    assert not controller.buffer.frozen


def test_a_slow_save_holds_training_only_until_its_policy_is_written(tmp_path: Path) -> None:
    """The step that copies the trainers' state for the next bundle waits for the save in flight's policy write,
    never for the rest of it (here its data-plane write, held back); the next save then waits for the whole one."""
    controller, client = make_controller(tmp_path, max_steps=4, save_period=2)
    client.write_gate = asyncio.Event()
    trainer = controller.args.trainers[0]

    async def body() -> None:
        await controller.restore()
        running = asyncio.create_task(controller.run())
        await until(lambda: len(trainer.called("train_step")) == 4 or running.done(), seconds=60)
        assert not running.done() and client.snapshots == [], "the save of step 2 is still writing"
        assert trainer.called("write_captured") == [2], "step 4's copy was taken after step 2's policy was written"
        client.write_gate.set()
        await running

    run(body())
    assert trainer.called("write_captured") == [2, 4]
    assert [r.step for r in controller.progress(0) if isinstance(r, SaveRecord)] == [2, 4]
