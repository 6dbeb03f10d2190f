"""SingleControllerActor in process (no Ray): the pumps, the sampler's staleness window and the restore's inventory
check, against fake workers and the in-memory data plane (``harness``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.checkpoint.lease import CheckpointDirNotShared, Lease
from sc_app.controller.actor import InventoryMismatch, _StopNow
from sc_app.progress import StepRecord
from tests.unit.controller.harness import G, commit, make_controller, run


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


def test_restore_refuses_a_data_plane_that_holds_rows_the_index_does_not(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path)
    client.rows["p9:0"] = {"reward": torch.zeros(())}
    with pytest.raises(InventoryMismatch):
        run(controller.restore())
    with pytest.raises(RuntimeError, match="before restore"):
        run(controller.run())


def test_a_controller_on_a_node_without_the_checkpoint_dir_refuses_to_restore_before_touching_anything(
    tmp_path: Path,
) -> None:
    """Its node sees another disk at checkpoint.dir (no LEASE there): one ``CheckpointDirNotShared`` naming it, raised
    before it connects to the data plane or reads a sidecar — the driver then stops instead of blaming the bundle."""
    controller, _ = make_controller(tmp_path, save_period=2)
    taken = Lease.acquire(tmp_path / "drivers-disk", "run-test")
    (tmp_path / "ckpt").mkdir()
    controller.args.lease = Lease(tmp_path / "ckpt", taken.run_id, taken.fencing_epoch)
    with pytest.raises(CheckpointDirNotShared, match=r"^the controller actor on host \S+ does not see"):
        run(controller.restore())
    assert not hasattr(controller, "client"), "it connected to the data plane first"
    assert list((tmp_path / "ckpt").iterdir()) == []
