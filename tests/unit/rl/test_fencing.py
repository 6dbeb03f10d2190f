"""Epoch fencing of the workers a warm in-job restore keeps (``sc_app.rl.fencing``): the pure fence, and the real
worker classes run in process (no Ray) — a call issued before a reset that arrives after it is refused, counted,
and changes nothing. The reply side (a rollout stamped with an old epoch) is ``test_worker_restart.py``'s."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sc_app.config.app import load_config
from sc_app.rl.fencing import EpochFence, StaleEpoch

ray = pytest.importorskip("ray")


def test_the_fence_refuses_and_counts_older_epochs_only() -> None:
    fence = EpochFence()
    fence.admit(None, "x")  # an unfenced caller
    fence.admit(0, "x")
    fence.advance(2)
    fence.admit(2, "x")
    fence.admit(3, "x")
    with pytest.raises(StaleEpoch, match="generate from epoch 1 refused: reset to epoch 2"):
        fence.admit(1, "generate")
    with pytest.raises(StaleEpoch):
        fence.advance(1)  # a reset never goes backwards
    assert fence.refused == 2 and fence.epoch == 2


def _actor_class(remote_class: Any) -> Any:
    return remote_class.__ray_actor_class__


def test_a_generate_or_weights_call_from_before_a_reset_is_refused_by_the_engine() -> None:
    from sc_app.rl.generation import GenerationWorker

    cfg = load_config(None, [])
    worker = _actor_class(GenerationWorker)(cfg.model_dump_json(), 0)
    worker.setup(None)
    before = worker.generate([0], 4)
    assert before.epoch == 4, "a rollout carries the epoch of the call that produced it"
    weights = {k: torch.zeros_like(v) for k, v in worker.backend.model.state_dict().items()}
    kept = {k: v.clone() for k, v in worker.backend.model.state_dict().items()}
    reset = worker.reset(5)
    assert reset.refused == 0 and reset.pid > 0
    with pytest.raises(StaleEpoch):
        worker.generate([1], 4)  # issued by the old job, delayed past the reset
    with pytest.raises(StaleEpoch):
        worker.set_weights(weights, 99, 4)
    assert all(torch.equal(v, kept[k]) for k, v in worker.backend.model.state_dict().items()), "nothing landed"
    assert worker.backend.version != 99 and worker.reset(6).refused == 2
    assert worker.generate([1], 6).epoch == 6


def test_a_train_step_from_before_a_reset_is_refused_before_it_reads_or_trains() -> None:
    from sc_app.rl.trainer import TrainerWorker

    cfg = load_config(None, [])
    worker = _actor_class(TrainerWorker)(cfg.model_dump_json(), 0, 1)
    worker.setup("", 0)
    kept = {k: v.clone() for k, v in worker.backend.model.state_dict().items()}
    assert worker.reset(3).version_before == 0
    with pytest.raises(StaleEpoch, match="train_step from epoch 2"):
        worker.train_step(["p0_0"], 1, False, 2)  # no data plane here: refused before any read
    assert worker._dp is None, "no data-plane client was built for it"
    assert all(torch.equal(v, kept[k]) for k, v in worker.backend.model.state_dict().items())
    assert worker.backend.version == 0 and worker.fence.refused == 1
