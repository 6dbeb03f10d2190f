"""policy.grpo: group-normalised advantages and the clipped policy-gradient loss."""

from __future__ import annotations

import torch

from sc_app.rl.grpo import clipped_pg_loss, group_advantages


def test_advantages_are_normalised_within_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 7.0, 3.0])
    adv = group_advantages(rewards, group_size=4)
    groups = adv.view(2, 4)
    assert torch.allclose(groups.mean(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(groups.std(dim=1), torch.ones(2), atol=1e-4)
    assert adv[0] > 0 > adv[1] and adv[6] > adv[4] > adv[7]


def test_equal_rewards_give_zero_advantage_not_nan() -> None:
    adv = group_advantages(torch.ones(4), group_size=4)
    assert torch.equal(adv, torch.zeros(4))


def test_loss_is_minus_the_advantage_weighted_ratio_inside_the_clip() -> None:
    old = torch.log(torch.full((2, 3), 0.5))
    new = old.clone()
    adv = torch.tensor([1.0, -2.0])
    loss = clipped_pg_loss(new, old, adv)
    assert torch.isclose(loss, -adv.mean())  # ratio 1 everywhere


def test_clip_caps_the_gain_from_moving_too_far() -> None:
    old = torch.zeros(1, 1)
    adv = torch.tensor([1.0])
    far = clipped_pg_loss(torch.full((1, 1), 2.0), old, adv)  # ratio e^2 > 1.2: clipped at 1.2
    assert torch.isclose(far, torch.tensor(-1.2))
    new = torch.full((1, 1), 2.0, requires_grad=True)
    clipped_pg_loss(new, old, adv).backward()
    assert new.grad is not None and torch.all(new.grad == 0), "no gradient past the clip for a positive advantage"


def test_gradient_raises_the_logprob_of_good_samples() -> None:
    old = torch.zeros(2, 2)
    new = torch.zeros(2, 2, requires_grad=True)
    clipped_pg_loss(new, old, torch.tensor([1.0, -1.0])).backward()
    assert new.grad is not None
    assert torch.all(new.grad[0] < 0) and torch.all(new.grad[1] > 0), "descent raises row 0, lowers row 1"


def test_without_a_mask_the_loss_is_the_plain_mean() -> None:
    new, old, adv = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3)
    ratio = torch.exp(new - old)
    want = -torch.minimum(ratio * adv[:, None], ratio.clamp(0.8, 1.2) * adv[:, None]).mean()
    assert torch.equal(clipped_pg_loss(new, old, adv), want)


def test_masked_tokens_carry_no_gradient_and_micro_losses_add_up() -> None:
    g = torch.Generator().manual_seed(0)
    new = torch.randn(4, 5, generator=g, requires_grad=True)
    old = new.detach() + 0.01 * torch.randn(4, 5, generator=g)  # ratios near 1: inside the clip, gradients flow
    adv = torch.tensor([1.0, -0.5, 2.0, -1.0])
    mask = torch.ones(4, 5)
    mask[0, 3:] = 0
    clipped_pg_loss(new, old, adv, mask=mask).backward()
    assert new.grad is not None and torch.all(new.grad[0, 3:] == 0) and torch.any(new.grad[0, :3] != 0)
    whole = clipped_pg_loss(new, old, adv, mask=mask)
    n = mask.sum()
    parts = sum(clipped_pg_loss(new[i : i + 2], old[i : i + 2], adv[i : i + 2], mask=mask[i : i + 2], num_tokens=n)
                for i in (0, 2))  # fmt: skip
    assert torch.allclose(whole, parts)
