"""generation.engine and the vLLM keys: defaults, and every combination that cannot run refused in one line naming
the key (pure config, no vLLM)."""

from __future__ import annotations

import pytest

from sc_app.config.app import ConfigError, load_config

HF = ["model.backend=hf", "model.path=/models/x"]


def test_the_default_engine_is_hf_and_vllm_is_accepted_with_the_hf_backend() -> None:
    cfg = load_config(None, [])
    assert cfg.generation.engine == "hf" and cfg.grpo.old_logprobs == "trainer"
    assert cfg.generation.weight_sync == "object_store" and cfg.generation.max_model_len is None
    cfg = load_config(None, [*HF, "generation.engine=vllm", "grpo.old_logprobs=engine", "generation.max_model_len=64"])
    assert (cfg.generation.engine, cfg.grpo.old_logprobs, cfg.generation.max_model_len) == ("vllm", "engine", 64)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["generation.engine=vllm"], "generation.engine=vllm needs model.backend=hf"),
        ([*HF, "generation.weight_sync=nccl"], "generation.weight_sync=nccl needs generation.engine=vllm"),
        ([*HF, "grpo.old_logprobs=engine"], "grpo.old_logprobs=engine needs generation.engine=vllm"),
        ([*HF, "generation.engine=vllm", "generation.weight_sync=nccl"], "on CPU use generation.weight_sync"),
        (
            [*HF, "generation.engine=vllm", "generation.weight_sync=nccl", "generation.num_gpus=1"],
            "needs GPUs on the trainer and generation workers",
        ),
        ([*HF, "generation.engine=vllm", "generation.max_model_len=7"], "generation.max_model_len=7 is below"),
        ([*HF, "generation.engine=sglang"], "generation.engine"),
        ([*HF, "generation.gpu_memory_utilization=1.5"], "generation.gpu_memory_utilization"),
    ],
)
def test_engine_settings_that_cannot_run_are_one_line(overrides: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_nccl_is_accepted_when_both_worker_groups_have_gpus() -> None:
    cfg = load_config(
        None,
        [
            *HF,
            "generation.engine=vllm",
            "generation.weight_sync=nccl",
            "generation.num_gpus=1",
            "trainer.num_gpus=1",
            "grpo.old_logprobs=engine",
        ],
    )
    assert cfg.generation.weight_sync == "nccl"
