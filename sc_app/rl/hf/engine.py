"""Generation engines: the interface the generation workers use, and its Hugging Face ``generate()`` engine.

A worker holds one engine. The controller only ever sees what a worker returns (tokens, masks, log-probs,
rewards, version), so another engine — vLLM, say — slots in by implementing ``GenerationEngine`` (load a full
state dict as one weights version; sample ``num_samples`` responses per prompt) without touching the controller.

Invariant of every engine: ``logprobs`` are those of ``logprobs.sequence_logprobs`` at the sampling temperature
(the function the trainer uses), so the importance ratio of a freshly generated row is 1 under the same weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.tasks import PromptBatch, response_mask


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    max_new_tokens: int = 4


@dataclass(frozen=True)
class GenerationOutput:
    """``N = B * num_samples`` rows, grouped contiguously per prompt (row ``j`` belongs to prompt ``j // num_samples``).

    ``tokens`` / ``attention_mask``: ``[N, P + R]`` (prompt left-padded, response right-padded); ``response_mask``
    ``[N, R]``: 1 up to and including the first eos; ``logprobs`` ``[N, R]``."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    version: int


class GenerationEngine(Protocol):
    version: int

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None: ...

    def generate(self, prompts: PromptBatch, num_samples: int, params: SamplingParams) -> GenerationOutput: ...


def eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a response: the generation config's eos (an int or a list) and the tokenizer's."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer names an eos token")
    return sorted(ids)


class HFGenerateEngine:
    """``model.generate()`` with explicit sampling settings (the model's generation_config.json does not leak in
    beyond its eos ids), then log-probs by one forward pass of the shared function."""

    def __init__(self, model: Any, *, eos: list[int], pad: int, device: torch.device) -> None:
        self.model = model.to(device).eval()
        self.eos, self.pad, self.device = list(eos), pad, device
        self.version = 0

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(dict(weights), strict=True)
        self.version = version

    @torch.no_grad()
    def generate(self, prompts: PromptBatch, num_samples: int, params: SamplingParams) -> GenerationOutput:
        from transformers import GenerationConfig

        tokens = prompts.tokens.repeat_interleave(num_samples, dim=0).to(self.device)
        mask = prompts.attention_mask.repeat_interleave(num_samples, dim=0).to(self.device)
        config = GenerationConfig(
            do_sample=True,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos,
            pad_token_id=self.pad,
            num_beams=1,
            repetition_penalty=1.0,
        )
        out = self.model.generate(input_ids=tokens, attention_mask=mask, generation_config=config)
        prompt_len = tokens.shape[1]
        responses = out[:, prompt_len:]
        short = params.max_new_tokens - responses.shape[1]
        if short > 0:  # every row stopped early: pad to the fixed response length
            responses = torch.cat([responses, responses.new_full((responses.shape[0], short), self.pad)], dim=1)
        resp_mask = response_mask(responses, self.eos)
        full = torch.cat([tokens, responses], dim=1)
        full_mask = torch.cat([mask, torch.ones_like(responses)], dim=1)
        logprobs = sequence_logprobs(self.model, full, full_mask, prompt_len, params.temperature)
        return GenerationOutput(
            tokens=full.cpu(),
            attention_mask=full_mask.cpu(),
            response_mask=resp_mask.cpu(),
            logprobs=logprobs.float().cpu(),
            version=self.version,
        )
