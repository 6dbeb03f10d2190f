"""The default task and its verifiable reward, plus the deterministic prompt stream.

``repeat_first``: the prompt is ``prompt_len`` random tokens; the right answer repeats the prompt's first token
``response_len`` times; the reward is the fraction of response tokens that are right (0..1). A random policy
scores ~1/vocab; a policy that learned the task scores ~1.
"""

from __future__ import annotations

import hashlib

import torch

from sc_app.config.app import ModelConfig, TaskConfig


def prompt_tokens(seed: int, prompt_index: int, task: TaskConfig, model: ModelConfig) -> torch.Tensor:
    """Prompt number ``prompt_index`` of the stream: the same tokens on every machine and every resume."""
    return random_prompt(seed, prompt_index % task.dataset_size, model.vocab_size, task.prompt_len)


def random_prompt(seed: int, position: int, vocab_size: int, length: int) -> torch.Tensor:
    """``length`` token ids in ``[0, vocab_size)``, a pure function of (seed, position)."""
    h = hashlib.sha256(f"{seed}:{position}".encode()).digest()
    g = torch.Generator().manual_seed(int.from_bytes(h[:8], "little"))
    return torch.randint(0, vocab_size, (length,), generator=g)


def reward(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """[B, P] prompts, [B, R] responses → [B] rewards in [0, 1]."""
    return (responses == prompts[:, :1]).float().mean(dim=1)
