"""Generation workers: Ray actors that sample groups of responses and score them with the task's reward."""

from __future__ import annotations

import ray
import torch

from sc_app.config import AppConfig
from sc_app.policy.model import TinyCausalLM
from sc_app.policy.task import prompt_tokens, reward


@ray.remote
class GenerationWorker:
    def __init__(self, cfg_json: str, worker_index: int) -> None:
        torch.set_num_threads(1)
        self.cfg = AppConfig.model_validate_json(cfg_json)
        torch.manual_seed(self.cfg.run.seed)
        self.model = TinyCausalLM(self.cfg.model).eval()
        self.version = 0
        self.gen = torch.Generator().manual_seed(self.cfg.run.seed * 1000 + worker_index)

    def set_weights(self, weights: dict[str, torch.Tensor], version: int) -> int:
        self.model.load_state_dict(weights)
        self.version = version
        return version

    @torch.no_grad()
    def generate(self, prompt_indices: list[int]) -> dict[str, torch.Tensor | int]:
        """``len(prompt_indices) * G`` rows, grouped contiguously per prompt.

        Returns tokens [N, P+R], logprobs [N, R] of the sampled tokens, rewards [N], and the weights version.
        """
        cfg = self.cfg
        group_size = cfg.grpo.num_generations_per_prompt
        prompts = torch.stack([prompt_tokens(cfg.run.seed, i, cfg.task, cfg.model) for i in prompt_indices])
        tokens = prompts.repeat_interleave(group_size, dim=0)
        logps = []
        for _ in range(cfg.task.response_len):
            logits = self.model(tokens)[:, -1, :] / cfg.grpo.temperature
            logp = torch.log_softmax(logits.float(), dim=-1)
            nxt = torch.multinomial(logp.exp(), 1, generator=self.gen)
            logps.append(logp.gather(-1, nxt))
            tokens = torch.cat([tokens, nxt], dim=1)
        responses = tokens[:, cfg.task.prompt_len :]
        return {
            "tokens": tokens,
            "logprobs": torch.cat(logps, dim=1),
            "rewards": reward(prompts.repeat_interleave(group_size, dim=0), responses),
            "version": self.version,
        }
