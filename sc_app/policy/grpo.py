"""GRPO pieces: group-normalised advantages and the clipped policy-gradient loss."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[G*n] rewards (grouped contiguously) → advantages normalised within each group."""
    r = rewards.float().view(-1, group_size)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + eps)
    return adv.view(-1)


def clipped_pg_loss(
    new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip: float = 0.2
) -> torch.Tensor:
    """PPO-style clipped surrogate over response tokens; ``advantages`` is per sequence."""
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    return -surrogate.mean()
