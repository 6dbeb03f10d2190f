"""The generation engine a generation worker holds, as ``generation.engine`` asks: ``hf`` (``generate()``) or
``vllm`` (``vllm_engine``, with the receiver of the run's weight transport, ``sc_app.rl.weight_sync.factory``). The
only place that chooses, so the backend stays engine-agnostic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from sc_app.config.app import AppConfig
from sc_app.rl.hf.chat import pad_id
from sc_app.rl.hf.engine import GenerationEngine, HFGenerateEngine, eos_ids
from sc_app.rl.hf.model_dir import ModelDir, load_model, resolve_dtype
from sc_app.rl.weight_sync.factory import transport_for


def build_engine(
    cfg: AppConfig, model_dir: ModelDir, tokenizer: Any, device: torch.device, worker_index: int = 0
) -> GenerationEngine:
    dtype = resolve_dtype(cfg.model.dtype, device.type)
    if cfg.generation.engine != "vllm":
        model = load_model(model_dir, dtype)
        return HFGenerateEngine(model, eos=eos_ids(model, tokenizer), pad=pad_id(tokenizer), device=device)
    from sc_app.rl.hf.engine_cache import CACHE_DIR
    from sc_app.rl.hf.vllm_engine import VLLMEngine, VLLMSettings, start_llm

    gen = cfg.generation
    settings = VLLMSettings(
        model_path=str(model_dir.path),
        dtype=str(dtype).removeprefix("torch."),
        seed=cfg.run.seed,
        max_model_len=gen.max_model_len or cfg.task.prompt_len + cfg.task.response_len,
        tensor_parallel_size=gen.tensor_parallel_size,
        gpu_memory_utilization=gen.gpu_memory_utilization,
        engine_logprobs=cfg.grpo.old_logprobs == "engine",
        on_gpu=device.type == "cuda",
        cache_root=str(Path(cfg.checkpoint.dir) / CACHE_DIR) if gen.engine_cache_gib > 0 else None,
        cache_max_gib=gen.engine_cache_gib,
    )
    llm = start_llm(settings)  # first: on a GPU the engine sizes its cache before the copy below takes memory
    model = load_model(model_dir, dtype)  # eos ids from its generation config, as the hf engine reads them
    eos = eos_ids(model, tokenizer)
    logprob_model = None if settings.engine_logprobs else model.to(device)
    receiver = transport_for(cfg).receiver(worker_index)
    return VLLMEngine(llm, settings, receiver=receiver, eos=eos, pad=pad_id(tokenizer), logprob_model=logprob_model)
