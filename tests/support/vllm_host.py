"""A real vLLM CPU engine in a process of its own, for the integration tests: vLLM binds threads, patches
``torch.set_num_threads`` and joins a torch.distributed group in the process it runs in, which must not be the
pytest worker's (later tests in it would inherit all of that). ``VLLMHost`` starts one engine (a ~15 s start) and
runs module-level functions of this file in its process, each getting the engine."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

TINY_LLAMA = {  # head_dim 64: what vLLM's CPU attention supports
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}

_state: dict[str, Any] = {}


def _start(model_path: str, seed: int, max_model_len: int, cache_root: str | None) -> None:
    os.environ.update(ENV)
    from sc_app.rl.hf.vllm_engine import VLLMSettings, start_llm

    settings = VLLMSettings(
        model_path=model_path, dtype="float32", seed=seed, max_model_len=max_model_len, cache_root=cache_root
    )
    _state["settings"] = settings
    try:
        _state["llm"] = start_llm(settings)
    except Exception as exc:  # kept for the test to read: an initializer's exception breaks the pool
        _state["error"] = exc


def engine_of(*, engine_logprobs: bool) -> Any:
    """A ``VLLMEngine`` on the host's one ``LLM`` (both log-prob modes share it); the trainer-mode copy is the
    model directory's HF model."""
    from dataclasses import replace

    import torch

    from sc_app.rl.hf.chat import pad_id
    from sc_app.rl.hf.engine import eos_ids
    from sc_app.rl.hf.model_dir import check_model_dir, load_model, load_tokenizer
    from sc_app.rl.hf.vllm_engine import VLLMEngine
    from sc_app.rl.weight_sync.object_store import StateDictReceiver

    key = f"engine-{engine_logprobs}"
    if key not in _state:
        settings = replace(_state["settings"], engine_logprobs=engine_logprobs)
        model_dir = check_model_dir(settings.model_path)
        model, tok = load_model(model_dir, torch.float32), load_tokenizer(model_dir)
        _state[key] = VLLMEngine(
            _state["llm"],
            settings,
            receiver=StateDictReceiver(),  # the object-store transport: the tests hand state dicts
            eos=eos_ids(model, tok),
            pad=pad_id(tok),
            logprob_model=model,
        )
    return _state[key]


def start_error() -> str | None:
    exc = _state.get("error")
    return None if exc is None else str(exc)


class VLLMHost:
    def __init__(
        self, model_path: str, *, seed: int = 0, max_model_len: int = 64, cache_root: str | None = None
    ) -> None:
        self.pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(model_path, seed, max_model_len, cache_root),
        )

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = 600) -> Any:
        return self.pool.submit(fn, *args).result(timeout=timeout)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
