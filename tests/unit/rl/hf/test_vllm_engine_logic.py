"""The vLLM engine's pure parts: per-request seeds and the one-line start-up error (no engine started)."""

from __future__ import annotations

import pytest

from sc_app.config.app import ConfigError, load_config
from sc_app.rl.hf.vllm_engine import _cause, _hint, request_seed
from sc_app.rl.hf.vllm_nccl import group_world_size, rank_offset, sender_for


def test_a_request_seed_is_a_function_of_run_seed_prompt_index_and_version() -> None:
    base = request_seed(0, 5, 3)
    assert base == request_seed(0, 5, 3)
    assert len({base, request_seed(1, 5, 3), request_seed(0, 6, 3), request_seed(0, 5, 4)}) == 4
    assert all(0 <= request_seed(s, i, v) < 2**62 for s in range(3) for i in range(50) for v in range(5))


def test_the_cause_is_the_innermost_error_on_one_line() -> None:
    try:
        try:
            raise NotImplementedError("Unsupported CPU attention configuration: head_dim=16\nmore detail")
        except NotImplementedError as inner:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from inner
    except RuntimeError as exc:
        cause = _cause(exc)
    assert cause == "NotImplementedError: Unsupported CPU attention configuration: head_dim=16"
    assert "generation.engine=hf" in _hint(cause)
    assert "gpu_memory_utilization" in _hint("ValueError: No available memory for the cache blocks")
    assert "does not support this model" in _hint("ValueError: Model architectures ['Foo'] are not supported")


def test_nccl_ranks_place_each_engines_workers_after_trainer_rank_0() -> None:
    assert group_world_size(num_engines=2, tensor_parallel_size=2) == 5
    assert [rank_offset(i, 2) for i in range(2)] == [1, 3]  # engine 0: ranks 1, 2; engine 1: ranks 3, 4


def test_only_trainer_rank_0_holds_a_sender_and_only_under_nccl() -> None:
    base = ["model.backend=hf", "model.path=/m", "generation.engine=vllm", "grpo.old_logprobs=engine"]
    gpus = ["generation.num_gpus=1", "trainer.num_gpus=1"]
    assert sender_for(load_config(None, [*base, *gpus]), 0) is None  # object_store
    nccl = load_config(None, [*base, *gpus, "generation.weight_sync=nccl"])
    assert sender_for(nccl, 1) is None
    with pytest.raises(ConfigError, match=r"needs grpo\.old_logprobs=engine"):
        load_config(None, [*base[:-1], *gpus, "generation.weight_sync=nccl"])
