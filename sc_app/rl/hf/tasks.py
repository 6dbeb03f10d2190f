"""Tasks of the hf backend in token space: prompt ids for a list of prompt indices, rewards for responses.

``repeat_first`` is the tiny backend's task on the model's own vocabulary (prompt tokens drawn from the
tokenizer's non-special tokens, so a right answer never contains a stop token). ``jsonl`` reads the user's file,
applies the chat template, and scores decoded completions with ``task.reward``. Both left-pad prompts to
``prompt_len``; responses are scored up to (not including) the first eos token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from sc_app.rl.hf.chat import encode_prompt, left_pad, pad_id
from sc_app.rl.hf.dataset import DatasetError, JsonlDataset
from sc_app.rl.hf.rewards import RewardFn
from sc_app.rl.task import random_prompt
from sc_app.rl.task import reward as repeat_first_reward


@dataclass(frozen=True)
class PromptBatch:
    """``tokens`` / ``attention_mask``: ``[B, prompt_len]``, left-padded; ``indices``: the prompt indices."""

    indices: tuple[int, ...]
    tokens: torch.Tensor
    attention_mask: torch.Tensor


class TokenTask(Protocol):
    prompt_len: int
    response_len: int

    def prompts(self, indices: list[int]) -> PromptBatch: ...

    def rewards(self, indices: list[int], responses: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        """``indices`` per row, ``responses`` / ``response_mask`` ``[N, R]`` → ``[N]`` rewards."""
        ...


def response_mask(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """1 for every response token up to and including the first eos, 0 after it."""
    is_eos = torch.isin(responses, torch.tensor(eos_ids, dtype=responses.dtype))
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # eos tokens strictly before each position
    return (before == 0).long()


class RepeatFirstTask:
    """The default task in the model's vocabulary; reward = fraction of the response that repeats the first token."""

    def __init__(self, tokenizer: Any, *, seed: int, prompt_len: int, response_len: int, dataset_size: int) -> None:
        special = set(tokenizer.all_special_ids)
        self.allowed = torch.tensor([i for i in range(len(tokenizer)) if i not in special], dtype=torch.long)
        if len(self.allowed) < 2:
            raise ValueError("the tokenizer has fewer than 2 non-special tokens; repeat_first needs a vocabulary")
        self.seed, self.prompt_len, self.response_len, self.dataset_size = seed, prompt_len, response_len, dataset_size

    def prompt_ids(self, index: int) -> torch.Tensor:
        picks = random_prompt(self.seed, index % self.dataset_size, len(self.allowed), self.prompt_len)
        return self.allowed[picks]

    def prompts(self, indices: list[int]) -> PromptBatch:
        tokens = torch.stack([self.prompt_ids(i) for i in indices])
        return PromptBatch(tuple(indices), tokens, torch.ones_like(tokens))

    def rewards(self, indices: list[int], responses: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        prompts = torch.stack([self.prompt_ids(i) for i in indices])
        return repeat_first_reward(prompts, responses * response_mask + (response_mask - 1))  # after eos: -1, wrong


class JsonlTask:
    """The user's prompts and answers; the completion (up to eos, special tokens dropped) is scored by ``reward``."""

    def __init__(
        self, tokenizer: Any, dataset: JsonlDataset, reward: RewardFn, *, prompt_len: int, response_len: int
    ) -> None:
        self.tokenizer, self.dataset, self.reward = tokenizer, dataset, reward
        self.prompt_len, self.response_len = prompt_len, response_len
        self.pad = pad_id(tokenizer)
        self._ids: dict[int, list[int]] = {}

    def encoded(self, row: int) -> list[int]:
        ids = self._ids.get(row)
        if ids is None:
            ex = self.dataset.examples[row]
            ids = encode_prompt(self.tokenizer, ex.prompt)
            if len(ids) > self.prompt_len:
                raise DatasetError(
                    f"task.path {self.dataset.path} line {ex.line}: the prompt is {len(ids)} tokens with the chat "
                    f"template, over task.prompt_len={self.prompt_len}; raise task.prompt_len or shorten the prompt"
                )
            self._ids[row] = ids
        return ids

    def check_lengths(self) -> int:
        """Encode every prompt once; returns the longest length. ``DatasetError`` names the first too long."""
        return max(len(self.encoded(row)) for row in range(len(self.dataset)))

    def prompts(self, indices: list[int]) -> PromptBatch:
        tokens, mask = left_pad([self.encoded(self.dataset.row(i)) for i in indices], self.prompt_len, self.pad)
        return PromptBatch(tuple(indices), tokens, mask)

    def completion(self, response: torch.Tensor, mask: torch.Tensor) -> str:
        ids = response[mask.bool()].tolist()
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def rewards(self, indices: list[int], responses: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        out = []
        for i, resp, mask in zip(indices, responses, response_mask, strict=True):
            ex = self.dataset[i]
            out.append(self.reward(prompt=ex.prompt, completion=self.completion(resp, mask), answer=ex.answer))
        return torch.tensor(out, dtype=torch.float32)
