"""The controller's saves (``SaveCoordinator``) in process: the capture in the barrier window, saves cut at their
steps behind training, a slow save holding training only until its policy is written."""

from __future__ import annotations

import asyncio
import errno
import json
import time
from pathlib import Path
from typing import Any, Literal

import pytest
import torch

from sc_app.checkpoint import BundleWriter
from sc_app.checkpoint.lease import not_shared
from sc_app.controller.saves import InventoryMismatch, SaveFailed
from sc_app.data_plane.client import DataPlaneDetached
from sc_app.progress import SaveFailedRecord, SaveRecord, StopRecord
from tests.support.fake_data_plane import FakeDataPlane, until
from tests.unit.controller.harness import G, commit, make_controller, run


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
        return await controller.saves.capture(writer, step=controller.step, version=controller.version)

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
        controller.saves.captured(controller.version)
        writer = BundleWriter(str(tmp_path / "ckpt"), controller.step, hmac_key=None, lease=None)
        with pytest.raises(InventoryMismatch):
            await controller.saves.capture(writer, step=controller.step, version=controller.version)

    run(body())
    assert "save_checkpoint" not in client.calls
    assert not controller.barrier.checkpoint_held and not controller.buffer.frozen


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


def _full_disk(policy_dir: str, target: Any = None) -> Any:
    raise OSError(errno.ENOSPC, "No space left on device", f"{policy_dir}/model.pt")


def _lost_mount(policy_dir: str, target: Any = None) -> Any:
    raise not_shared("trainer rank 0", policy_dir, "the bundle's policy directory is not there")


def test_a_save_that_fails_on_io_is_reported_and_training_goes_on(tmp_path: Path) -> None:
    controller, _ = make_controller(tmp_path, max_steps=4, save_period=2)
    controller.args.trainers[0].write_captured = _full_disk  # type: ignore[method-assign]

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    summary = run(body())
    failed = [r for r in controller.progress(0) if isinstance(r, SaveFailedRecord)]
    assert [(r.step, r.in_a_row, r.last_saved_step) for r in failed] == [(2, 1, 0), (4, 2, 0)]
    assert "No space left on device: " in failed[0].error and "tmp_step_2/policy/model.pt" in failed[0].error
    assert summary.final_step == 4 and summary.last_saved_step == 0 and summary.unsaved_steps == 4
    assert not list((tmp_path / "ckpt").glob("*step_*")), "no bundle and no tmp dir is left behind"


def test_a_trainer_whose_node_lost_the_checkpoint_dir_fails_the_save_with_its_line_not_the_run(tmp_path: Path) -> None:
    """A rank that no longer sees the directory (the start-up check passed; its node lost the mount) is a failed
    save per ``checkpoint.on_save_error``, its line naming the rank, its host and what to do."""
    controller, _ = make_controller(tmp_path, max_steps=2, save_period=2)
    controller.args.trainers[0].write_captured = _lost_mount  # type: ignore[method-assign]

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    summary = run(body())
    (failed,) = [r for r in controller.progress(0) if isinstance(r, SaveFailedRecord)]
    assert "save of step 2" in failed.error and "trainer rank 0 on host" in failed.error
    assert "does not see the run's checkpoint directory" in failed.error and "\n" not in failed.error
    assert summary.final_step == 2 and summary.unsaved_steps == 2
    assert not list((tmp_path / "ckpt").glob("*step_*")), "no bundle and no tmp dir is left behind"


def test_a_save_that_fails_on_io_stops_the_run_when_asked_to(tmp_path: Path) -> None:
    controller, _ = make_controller(tmp_path, max_steps=4, save_period=2)
    controller.cfg.checkpoint.on_save_error = "stop"
    controller.args.trainers[0].write_captured = _full_disk  # type: ignore[method-assign]

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    with pytest.raises(SaveFailed, match=r"save of step 2 .* \(checkpoint.on_save_error=stop\)"):
        run(body())
    assert not [r for r in controller.progress(0) if isinstance(r, SaveRecord)]


# ---------------------------------------------------------------------------------------------- a stop and saves
# (issue 31, class E: a save in flight at a stop, and one that would start after it)


class Stuck(asyncio.Event):
    """A gate that says when a write reached it."""

    entered = 0

    async def wait(self) -> Literal[True]:
        self.entered += 1
        return await super().wait()


def _stops(controller: Any) -> list[str]:
    return [r.emergency for r in controller.progress(0) if isinstance(r, StopRecord)]


def test_a_stop_abandons_an_older_save_that_cannot_finish_and_cuts_the_emergency_bundle(tmp_path: Path) -> None:
    """The save of step 2 hangs in its data-plane write (a slow volume); training reaches step 4, whose save waits
    for it. The stop (1 s budget) waits for step 2's save only until half the budget, abandons it (never renamed,
    its tmp dir left for quarantine) and publishes the emergency bundle of step 4 within the budget."""
    controller, client = make_controller(tmp_path, max_steps=100, save_period=2)
    stuck = client.write_gate = Stuck()  # never set: step 2's snapshot write never ends
    trainer = controller.args.trainers[0]

    async def body() -> Any:
        await controller.restore()
        running = asyncio.create_task(controller.run())
        await until(lambda: (len(trainer.called("train_step")) >= 4 and stuck.entered) or running.done(), seconds=60)
        client.write_gate = None  # only step 2's write is stuck
        await asyncio.sleep(0.2)
        assert not running.done() and len(trainer.called("train_step")) == 4, "step 4's save waits for step 2's"
        asked = time.monotonic()
        await controller.request_stop(time.time() + 1.0)
        summary = await running
        return summary, time.monotonic() - asked

    summary, took = run(body())
    assert not stuck.is_set()
    ckpt = tmp_path / "ckpt"
    saves = [r for r in controller.progress(0) if isinstance(r, SaveRecord)]
    assert [(r.step, r.emergency) for r in saves] == [(4, True)]
    assert took < 3.0, f"the stop took {took:.2f}s against its 1 s budget (2 s of slack for a loaded machine)"
    stops = _stops(controller)
    assert stops[0].startswith("save of step_2 abandoned: it would not finish within the stop's budget"), stops
    assert stops[1].startswith("emergency bundle: no save timed yet"), stops
    assert summary.last_saved_step == 4 and summary.final_step == 4 and not summary.emergency_skipped
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_4"]
    assert [p.name.split(".")[0] for p in ckpt.glob("tmp_step_*")] == ["tmp_step_2"], "left for quarantine"


def test_a_save_of_the_step_reached_that_cannot_finish_is_abandoned_without_a_second_try(tmp_path: Path) -> None:
    """The save in flight is of the step the stop wants a bundle of: it is waited for all of the budget but a
    margin, then abandoned; the same bundle is not tried again (it could not finish either)."""
    controller, client = make_controller(tmp_path, max_steps=100, save_period=2)
    client.write_gate = asyncio.Event()

    async def body() -> tuple[bool, float]:
        await controller.restore()
        await commit(controller, 0, 0)
        saves = controller.saves
        saves.captured(controller.version)
        await saves.start(1, controller.version)
        asked = time.monotonic()
        skipped = await saves.emergency(1, controller.version, time.time() + 1.0)
        return skipped, time.monotonic() - asked

    skipped, took = run(body())
    assert skipped and 0.5 < took < 3.0, took  # waited most of its 1 s budget, not for the stuck save
    assert _stops(controller) == [
        "save of step_1 abandoned: it would not finish within the stop's budget; never renamed, the next start "
        "quarantines its tmp dir"
    ]
    assert not list((tmp_path / "ckpt").glob("step_*"))
    assert len(list((tmp_path / "ckpt").glob("tmp_step_1*"))) == 1


def test_a_save_in_flight_that_finishes_in_time_is_kept(tmp_path: Path) -> None:
    controller, client = make_controller(tmp_path, max_steps=100, save_period=2)
    gate = client.write_gate = asyncio.Event()

    async def body() -> bool:
        await controller.restore()
        await commit(controller, 0, 0)
        controller.saves.captured(controller.version)
        await controller.saves.start(1, controller.version)
        asyncio.get_running_loop().call_later(0.1, gate.set)
        return await controller.saves.emergency(1, controller.version, time.time() + 5.0)

    assert run(body()) is False
    assert [(r.step, r.emergency) for r in controller.progress(0) if isinstance(r, SaveRecord)] == [(1, False)]
    assert _stops(controller) == [], "nothing abandoned, no second bundle of the same step"


def test_no_periodic_save_starts_after_a_stop(tmp_path: Path) -> None:
    """The stop arrives while step 2 trains (a step a save is due at): no periodic save of it starts; the stop's
    emergency bundle is the one bundle of step 2."""
    controller, _ = make_controller(tmp_path, max_steps=100, save_period=2)
    trainer = controller.args.trainers[0]
    original = type(trainer).train_step

    def stop_in_step_2(sample_ids: list[str], version: int, capture: bool) -> Any:
        if version == 2:
            asyncio.get_running_loop().create_task(controller.request_stop(time.time() + 30))
        return original(trainer, sample_ids, version, capture)

    trainer.train_step = stop_in_step_2  # type: ignore[method-assign]

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    summary = run(body())
    saves = [r for r in controller.progress(0) if isinstance(r, SaveRecord)]
    assert [(r.step, r.emergency) for r in saves] == [(2, True)], saves
    assert summary.final_step == 2 and summary.last_saved_step == 2


def test_a_save_abandoned_by_a_warm_restore_never_reaches_the_data_plane_again(tmp_path: Path) -> None:
    """A warm in-job restore halts the controller with a save in flight and leaves that save to end on its own
    (``settle``, ``abandon``). Its snapshot write ends only once the old data plane is gone (a dead storage unit:
    TransferQueue waits up to 200 s), and then its ``thaw()`` clears the rows of the groups trained meanwhile — by
    the old data plane's global indexes, or by key. The controller's TransferQueue client is per process and
    re-attaches to the rebuilt data plane, so that clear removed rows the restore had just put back (at load, the
    next advantage read found 32 of 64 rows). ``halt`` fences the old run's client: nothing reaches a data plane
    through it after the halt."""
    controller, old = make_controller(tmp_path, max_steps=8, save_period=2)
    old.indexes = {}  # global indexes handed out, as TransferQueue does
    old.write_gate = asyncio.Event()  # step 2's snapshot write is stuck (a dead storage unit)
    new = FakeDataPlane()  # the rebuilt data plane

    async def body() -> BaseException | None:
        await controller.restore()
        running = asyncio.create_task(controller.run())
        # step 3 trained and dropped groups step 2's save captured: their clear waits for that save's thaw()
        await until(lambda: bool(controller.buffer._deferred_clears) or running.done(), seconds=60)
        assert not running.done()
        abandoned = controller.saves._pending
        assert abandoned is not None and abandoned[0] == 2
        await controller.halt(10)
        halted_at = len(old.calls)
        controller._connect, controller._disconnect = (lambda cfg: new), (lambda: None)
        await controller.reset(controller.args)
        await controller.restore()
        old.write_gate.set()  # the old data plane is gone: the stuck write ends
        (outcome,) = await asyncio.gather(abandoned[1], return_exceptions=True)
        assert old.calls[halted_at:] == [], f"the abandoned save reached the data plane: {old.calls[halted_at:]}"
        return outcome if isinstance(outcome, BaseException) else None

    outcome = run(body())
    chain = []
    while outcome is not None:  # (its tmp dir's removal then fails too: settle shut its I/O thread)
        chain.append(type(outcome))
        outcome = outcome.__context__
    assert DataPlaneDetached in chain, f"the abandoned save ended refused by the fence, not {chain}"
