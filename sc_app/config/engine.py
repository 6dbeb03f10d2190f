"""The generation-engine keys of the config (``generation.engine`` and the vLLM engine's settings) and the checks
that tie them to the rest of the config. Pure: imports neither Ray nor torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class EngineSettings(BaseModel):
    """Mixed into ``generation``: which engine samples, and the vLLM engine's knobs (docs/vllm.md)."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="hf: Hugging Face generate() (any model, slow; the default); vllm: a vLLM engine in each "
        "generation worker (model.backend=hf; the engine to train with). See docs/vllm.md.",
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs one engine spans (give it as many num_gpus).")
    gpu_memory_utilization: float = Field(
        0.7, gt=0, le=1, description="vllm on GPU: fraction of the GPU the engine takes (weights + KV cache)."
    )
    max_model_len: int | None = Field(
        None, ge=2, description="vllm: longest sequence the engine serves (None: task.prompt_len + task.response_len)."
    )
    engine_cache_gib: float = Field(
        4.0,
        ge=0,
        description="vllm: bound (GiB) on the engines' compile cache kept under <checkpoint.dir>/engine_cache/, reused "
        "by the next start of the same model, settings and vLLM version (docs/vllm.md); 0: off.",
    )
    weight_sync: Literal["object_store", "nccl"] = Field(
        "object_store",
        description="vllm: how each weights version reaches the engines. object_store: Ray's object store (CPU or "
        "GPU); nccl: broadcast from trainer rank 0 over NCCL (GPU only).",
    )


OLD_LOGPROBS_HELP = (
    "generation.engine=vllm: the log-probs the importance ratio divides by. trainer: the trainer's log-prob "
    "function at the sampling weights version (exact); engine: vLLM's sampled-token log-probs (no extra forward)."
)


def check_engine(cfg: Any) -> None:
    """``ValueError`` (one line naming the key) for an engine setting the rest of ``cfg`` (an ``AppConfig``) cannot
    run. ``cfg`` is typed ``Any``: ``sc_app.config.app`` imports this module, so importing it back would be a cycle."""
    gen = cfg.generation
    if gen.engine == "vllm" and cfg.model.backend != "hf":
        raise ValueError(
            "generation.engine=vllm needs model.backend=hf (vLLM serves Hugging Face models, not the tiny one); "
            "set model.backend=hf and model.path, or generation.engine=hf"
        )
    if gen.engine != "vllm":
        for key, value, default in (
            ("generation.weight_sync", gen.weight_sync, "object_store"),
            ("grpo.old_logprobs", cfg.grpo.old_logprobs, "trainer"),
        ):
            if value != default:
                raise ValueError(f"{key}={value} needs generation.engine=vllm; unset it or set generation.engine=vllm")
        return
    seq = cfg.task.prompt_len + cfg.task.response_len
    if gen.max_model_len is not None and gen.max_model_len < seq:
        raise ValueError(
            f"generation.max_model_len={gen.max_model_len} is below task.prompt_len + task.response_len = {seq}; "
            "raise it or unset it"
        )
    if gen.weight_sync == "nccl" and (gen.num_gpus <= 0 or cfg.trainer.num_gpus <= 0):
        raise ValueError(
            "generation.weight_sync=nccl needs GPUs on the trainer and generation workers (trainer.num_gpus and "
            "generation.num_gpus > 0); on CPU use generation.weight_sync=object_store"
        )
    if gen.weight_sync == "nccl" and cfg.grpo.old_logprobs != "engine":
        raise ValueError(
            "generation.weight_sync=nccl needs grpo.old_logprobs=engine (the weights reach only the vLLM engine, not "
            "the trainer-function copy); set it, or use generation.weight_sync=object_store"
        )
