"""GRPO pieces: group-normalised advantages and the clipped policy-gradient loss."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """[G*n] rewards (grouped contiguously) → advantages normalised within each group."""
    r = rewards.float().view(-1, group_size)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + eps)
    return adv.view(-1)


def clipped_pg_loss(
    new_logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip: float = 0.2,
    *,
    mask: torch.Tensor | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """PPO-style clipped surrogate over response tokens; ``advantages`` is per sequence.

    Without ``mask`` every response token counts (the mean over ``[B, R]``). With ``mask`` (1 = a real response
    token, 0 = padding after eos) the loss is the sum over real tokens divided by ``num_tokens`` (default: their
    count), so micro-batches that share one ``num_tokens`` add up to the loss of the whole batch."""
    ratio = torch.exp(new_logp - old_logp)
    adv = advantages.unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    if mask is None:
        return -surrogate.mean()
    m = mask.to(surrogate.dtype)
    denom = m.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    return -(surrogate * m).sum() / denom
