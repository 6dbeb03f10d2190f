"""hf backend trainer: micro-batches that add up to the whole batch, float32 master weights with low-precision
compute (also FSDP2's mixed precision on CPU), and DDP replicas that stay identical (gloo ranks in processes)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings
from tests.support.hf import make_model_dir, run_ranks

CPU = torch.device("cpu")
P, R = 4, 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_model_dir(tmp_path_factory.mktemp("model")))


def batch_for(trainer: HFTrainer, seed: int, n: int = 6) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, trainer.hf_model.config.vocab_size, (n, P + R), generator=g)
    mask = torch.ones_like(tokens)
    mask[1, :2] = 0  # a left-padded prompt
    rmask = torch.ones(n, R, dtype=torch.long)
    rmask[2, 1:] = 0  # a response that ended at its first token
    with torch.no_grad():
        old = sequence_logprobs(trainer.hf_model, tokens, mask, P) - 0.05
    return TrainBatch(tokens, mask, rmask, old, torch.randn(n, generator=g))


def weights_hash(model: Any) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode() + t.detach().float().numpy().tobytes())
    return h.hexdigest()


def test_micro_batches_give_the_whole_batchs_step(model_dir: str) -> None:
    whole = HFTrainer(TrainerSettings(model_dir, learning_rate=1e-2, prompt_len=P), 0, 1, CPU)
    micro = HFTrainer(TrainerSettings(model_dir, learning_rate=1e-2, prompt_len=P, micro_batch_rows=2), 0, 1, CPU)
    batch = batch_for(whole, 0)
    before = weights_hash(whole.hf_model)
    a, b = whole.train_step(batch, 1), micro.train_step(batch, 1)
    assert a.loss == pytest.approx(b.loss, abs=1e-6)
    assert a.tokens == b.tokens == 6 * R - 3
    assert weights_hash(whole.hf_model) != before
    grads = zip(whole.hf_model.named_parameters(), micro.hf_model.named_parameters(), strict=True)
    for (name, x), (_, y) in grads:  # the gradients the step used (Adam's first step is sign-like: compare these)
        assert x.grad is not None and y.grad is not None, name
        assert torch.allclose(x.grad, y.grad, atol=1e-7, rtol=1e-4), name


def test_bfloat16_compute_keeps_float32_master_weights(model_dir: str) -> None:
    trainer = HFTrainer(TrainerSettings(model_dir, dtype="bfloat16", prompt_len=P, max_grad_norm=1.0), 0, 1, CPU)
    stats = trainer.train_step(batch_for(trainer, 1), 1)
    assert torch.isfinite(torch.tensor(stats.loss)) and stats.grad_norm is not None
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    weights = trainer.full_weights()
    assert weights is not None and {v.dtype for v in weights.values()} == {torch.bfloat16}


def ranks_train(rank: int, world: int, model_dir: str, strategy: str, dtype: str) -> dict[str, Any]:
    trainer = HFTrainer(TrainerSettings(model_dir, dtype=dtype, strategy=strategy, prompt_len=P), rank, world, CPU)  # type: ignore[arg-type]
    before = weights_hash(trainer.hf_model) if strategy == "ddp" else None
    stats = [trainer.train_step(batch_for(trainer, 10 + rank), v) for v in (1, 2)]  # each rank its own rows
    full = trainer.full_weights()
    return {
        "loss": [s.loss for s in stats],
        "param_dtypes": sorted({str(p.dtype) for p in trainer.model.parameters()}),
        "before": before,
        "after": weights_hash(trainer.hf_model) if strategy == "ddp" else None,
        "full": None if full is None else hashlib.sha256(
            b"".join(k.encode() + v.float().numpy().tobytes() for k, v in sorted(full.items()))
        ).hexdigest(),
    }  # fmt: skip


@pytest.mark.slow  # two ranks, each a process of its own with a process group
def test_ddp_replicas_stay_identical(model_dir: str, tmp_path: Path) -> None:
    out = run_ranks(ranks_train, 2, model_dir, "ddp", "float32", tmp=tmp_path)
    assert out[0]["after"] == out[1]["after"] != out[0]["before"], "gradients are averaged: one model on two ranks"
    assert out[0]["loss"] != out[1]["loss"], "each rank trained on its own rows"
    assert out[0]["full"] is not None and out[1]["full"] is None


@pytest.mark.slow  # two ranks, each a process of its own with a process group
def test_fsdp2_mixed_precision_on_cpu(model_dir: str, tmp_path: Path) -> None:
    out = run_ranks(ranks_train, 2, model_dir, "fsdp", "bfloat16", tmp=tmp_path)
    for r in out:
        assert r["param_dtypes"] == ["torch.float32"]
        assert all(torch.isfinite(torch.tensor(x)) for x in r["loss"])
    assert out[0]["full"] is not None
