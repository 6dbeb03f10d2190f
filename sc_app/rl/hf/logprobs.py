"""The one log-probability function that generation (old log-probs) and training (new log-probs) share.

Positions count from the first real token of a left-padded row, as ``generate()`` counts them, so the same weights
give the same log-probs in both places (checked by the tests).
"""

from __future__ import annotations

from typing import Any

import torch


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model: Any, tokens: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probabilities ``[B, R]`` of ``tokens[:, prompt_len:]`` under ``model`` at ``temperature``."""
    response_len = tokens.shape[1] - prompt_len
    out = model(
        input_ids=tokens,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        use_cache=False,
        logits_to_keep=response_len + 1,  # only the positions that predict a response token (+ the last one)
    )
    logits = out.logits[:, :-1].float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, tokens[:, prompt_len:].unsqueeze(-1)).squeeze(-1)
