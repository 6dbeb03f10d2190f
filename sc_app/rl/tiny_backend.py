"""The tiny backend (``model.backend: tiny``, the embedded default): the tiny causal LM, trained and sampled.

Trainer: every rank holds the whole model; with several ranks gradients are all-reduced (averaged), so all ranks
hold identical weights and rank 0 alone saves (``policy/model.pt`` + ``optimizer.pt``) and serves weights.
Generation: token-by-token sampling of ``task.response_len`` tokens, scored by the ``repeat_first`` reward.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from sc_app.checkpoint.layout import MODEL_FILE, OPTIMIZER_FILE
from sc_app.checkpoint.writer import FileRecord
from sc_app.config.app import AppConfig
from sc_app.io import torch_files
from sc_app.rl.backend import PolicyFingerprint, Rollout, TrainStepResult
from sc_app.rl.grpo import clipped_pg_loss
from sc_app.rl.model import TinyCausalLM, response_logprobs
from sc_app.rl.state_schema import PolicyTemplate, check_model_state, check_optimizer_state, new_optimizer
from sc_app.rl.task import prompt_tokens, reward


class TinyTrainerBackend:
    fields = ("tokens", "logprobs", "advantage")

    def __init__(self, cfg: AppConfig, rank: int, world_size: int, device: torch.device) -> None:
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        torch.manual_seed(cfg.run.seed)
        self.model = TinyCausalLM(cfg.model).to(device)
        self.optimizer = new_optimizer(self.model.parameters(), lr=cfg.grpo.learning_rate)
        self.version = 0
        self._captured: tuple[dict[str, Any], dict[str, Any]] | None = None
        if world_size > 1:
            import torch.distributed as dist

            for p in self.model.parameters():  # identical start on every rank
                dist.broadcast(p.data, src=0)

    def train_step(self, rows: TensorDict, version: int) -> TrainStepResult:
        tokens = rows["tokens"].to(self.device)
        old_logp = rows["logprobs"].to(self.device)
        adv = rows["advantage"].to(self.device)
        self.model.train()
        new_logp = response_logprobs(self.model, tokens, self.cfg.task.prompt_len)
        loss = clipped_pg_loss(new_logp, old_logp, adv)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.world_size > 1:
            import torch.distributed as dist

            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= self.world_size
        self.optimizer.step()
        self.version = version
        return TrainStepResult(loss=float(loss.detach()), rows=int(tokens.shape[0]))

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        return self._weights() if self.rank == 0 else None

    def capture(self) -> int:
        """Copy weights + optimizer (rank 0; the other ranks hold the same) for ``write_captured``."""
        if self.rank == 0:
            weights = self._weights()
            if self.device.type == "cpu":  # _weights() already copied to the host for a GPU model
                weights = {k: v.clone() for k, v in weights.items()}
            self._captured = (
                {"model": weights, "version": self.version},
                copy.deepcopy(self.optimizer.state_dict()),
            )
        return self.version

    def write_captured(self, policy_dir: Path) -> dict[str, FileRecord]:
        """Rank 0 writes ``model.pt`` and ``optimizer.pt`` (fsynced, hashed as written: the manifest reuses it)."""
        if self.rank != 0:
            return {}
        if self._captured is None:
            raise RuntimeError("write_captured() before capture()")
        model, optimizer = self._captured
        return {
            MODEL_FILE: torch_files.save(model, policy_dir / MODEL_FILE),
            OPTIMIZER_FILE: torch_files.save(optimizer, policy_dir / OPTIMIZER_FILE),
        }

    def load(self, policy_dir: Path, expected: Mapping[str, str]) -> int:
        """Restore from a *verified* bundle (``weights_only=True``), each file checked by the validator verification
        used (``sc_app.rl.state_schema``); returns the version."""
        template = PolicyTemplate.of(self.model, self.optimizer)
        state = check_model_state(torch_files.load(policy_dir / MODEL_FILE, map_location=self.device), template)
        optimizer = check_optimizer_state(
            torch_files.load(policy_dir / OPTIMIZER_FILE, map_location=self.device), template
        )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(optimizer)
        self.version = int(state["version"])
        return self.version

    def fingerprint(self) -> PolicyFingerprint | None:
        from sc_app.rl.fingerprint import optimizer_sha256, weights_sha256

        if self.rank != 0:
            return None
        return PolicyFingerprint(weights_sha256(self._weights()), optimizer_sha256(self.optimizer.state_dict()))


class TinyGenerationBackend:
    def __init__(self, cfg: AppConfig, worker_index: int) -> None:
        self.cfg = cfg
        torch.manual_seed(cfg.run.seed)
        self.model = TinyCausalLM(cfg.model).eval()
        self.version = 0
        self.gen = torch.Generator().manual_seed(cfg.run.seed * 1000 + worker_index)

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(dict(weights))
        self.version = version

    @torch.no_grad()
    def generate(self, prompt_indices: list[int]) -> Rollout:
        """Fields: tokens [N, P+R], logprobs [N, R] of the sampled tokens, reward [N]."""
        cfg = self.cfg
        group_size = cfg.grpo.group_size
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
        fields = {
            "tokens": tokens,
            "logprobs": torch.cat(logps, dim=1),
            "reward": reward(prompts.repeat_interleave(group_size, dim=0), responses),
        }
        return Rollout(fields, self.version)
