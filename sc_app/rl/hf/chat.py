"""Prompt text → token ids (through the tokenizer's chat template when it has one) and left padding.

Prompts are left-padded to a fixed length so every row of a step has the same shape in the data plane; the
attention mask marks the padding, and positions are counted from the first real token (``logprobs.position_ids``).
"""

from __future__ import annotations

from typing import Any

import torch


def pad_id(tokenizer: Any) -> int:
    """The id used for padding: the tokenizer's pad token, else its eos token."""
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token")
    return int(pid)


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """One user message → ids ready for generation (chat template with the generation prompt when there is one)."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def left_pad(sequences: list[list[int]], length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, length]`` ids and attention mask; pre: every sequence has 1..length ids."""
    ids = torch.full((len(sequences), length), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if not 0 < len(seq) <= length:
            raise ValueError(f"sequence {i} has {len(seq)} ids, expected 1..{length}")
        ids[i, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, length - len(seq) :] = 1
    return ids, mask
