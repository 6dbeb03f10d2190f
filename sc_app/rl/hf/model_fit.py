"""The model, its tokenizer and the generation engine must fit each other — checked before Ray starts, one line each.

Each relation below, left unchecked, passed the start-up checks and failed later in a worker with a traceback:

* the tokenizer's ids must index the model's embedding: ``len(tokenizer)`` at most ``vocab_size`` (a tokenizer with
  added tokens over an un-resized model), and every special id (pad, eos, bos — the tokenizer's and those
  ``config.json`` / ``generation_config.json`` give the model) below it;
* with ``generation.engine=vllm``, ``generation.max_model_len`` (default: prompt + response) at most the model's
  context as vLLM derives it (``context_limit``: the smallest of its position keys, ``model_max_length`` in
  ``tokenizer_config.json``, a RoPE scaling factor) — vLLM's own refusal is a ``ValidationError`` naming neither
  the key nor the limit.

The context against ``task.prompt_len + task.response_len``, the weights against ``config.json`` and the chat
template against every prompt are checked beside this (``sc_app.rl.hf.inputs``).
"""

from __future__ import annotations

import json
from typing import Any

from sc_app.config.app import AppConfig
from sc_app.rl.hf.model_dir import ModelDir, ModelDirError

# vLLM's keys for a model's context (the smallest one present wins), and the RoPE types whose factor it does not
# apply again (vllm/config/model.py, _get_and_verify_max_len)
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
UNSCALED_ROPE = {"default", "su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
SPECIAL = ("pad_token_id", "eos_token_id", "bos_token_id")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: Any) -> list[int]:
    """An id or a list of ids (``eos_token_id`` may be either)."""
    items = value if isinstance(value, list) else [value]
    return [i for i in map(_int, items) if i is not None]


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def _json(model: ModelDir, name: str) -> dict[str, Any]:
    try:
        doc = json.loads((model.path / name).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def context_limit(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> tuple[int, str] | None:
    """The longest sequence vLLM serves this model, and what says so; None when nothing in the config does."""
    config = _text_config(config)
    found = [(v, f"{k} in config.json") for k in POSITION_KEYS if (v := _int(config.get(k))) is not None]
    if not found:
        return None
    limit, why = min(found)
    if (v := _int(config.get("model_max_length"))) is not None:
        limit, why = v, "model_max_length in config.json"
    if (v := _int(tokenizer_config.get("model_max_length"))) is not None and v < limit:
        limit, why = v, "model_max_length in tokenizer_config.json"
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        if kind not in UNSCALED_ROPE and isinstance(factor, int | float) and factor > 0:
            limit, why = int(limit * factor), f"{why} x its {kind} RoPE factor {factor:g}"
    return limit, why


def check_fit(cfg: AppConfig, model: ModelDir, tokenizer: Any) -> None:
    """``ModelDirError`` (one line naming the key, the values and what to do) for the first relation that fails."""
    config = _text_config(model.config)
    vocab = _int(config.get("vocab_size"))
    if vocab is not None:
        _check_vocab(model, tokenizer, vocab)
    if cfg.generation.engine == "vllm":
        wanted = cfg.generation.max_model_len or cfg.task.prompt_len + cfg.task.response_len
        key = "generation.max_model_len" if cfg.generation.max_model_len else "task.prompt_len + task.response_len"
        limit = context_limit(model.config, _json(model, "tokenizer_config.json"))
        if limit is not None and wanted > limit[0]:
            raise ModelDirError(
                f"{key}={wanted} exceeds the {limit[0]} positions vLLM serves model.path {model.path} "
                f"({limit[1]}); set generation.max_model_len to at most {limit[0]}"
            )


def _check_vocab(model: ModelDir, tokenizer: Any, vocab: int) -> None:
    size = len(tokenizer)
    if size > vocab:
        raise ModelDirError(
            f"model.path {model.path}: its tokenizer has {size} tokens but the model's vocab_size is {vocab} "
            f"(config.json): ids {vocab}..{size - 1} have no embedding; use the model's own tokenizer, or resize the "
            "model's embeddings to the tokenizer (resize_token_embeddings) and save it"
        )
    given = [(f"the tokenizer's {name}", _int(getattr(tokenizer, name, None))) for name in SPECIAL]
    for source in ("config.json", "generation_config.json"):
        doc = _text_config(_json(model, source)) if source != "config.json" else _text_config(model.config)
        given += [(f"{name} in {source}", i) for name in SPECIAL for i in _ids(doc.get(name))]
    for what, token in given:
        if token is not None and not 0 <= token < vocab:
            raise ModelDirError(
                f"model.path {model.path}: {what} is {token}, outside the model's vocab_size {vocab}; set it to a "
                "token id of the model"
            )
