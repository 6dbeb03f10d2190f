"""The hf backend behind the worker interfaces of ``sc_app.rl.backend``: ``HFTrainer`` for the trainer
workers, ``HFGenerateEngine`` + the configured task for the generation workers.

Data-plane fields of a row: ``tokens`` / ``attention_mask`` ``[P+R]`` (prompt left-padded to ``task.prompt_len``),
``response_mask`` / ``logprobs`` ``[R]``, ``reward`` (and ``advantage``, written by the controller).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from tensordict import TensorDict

from sc_app.checkpoint.writer import FileRecord
from sc_app.config.app import AppConfig
from sc_app.rl.backend import PolicyFingerprint, Rollout, TrainStepResult, device_for
from sc_app.rl.hf.dataset import DatasetError, load_jsonl
from sc_app.rl.hf.engine import SamplingParams
from sc_app.rl.hf.engine_factory import build_engine
from sc_app.rl.hf.model_dir import check_model_dir, load_tokenizer
from sc_app.rl.hf.rewards import resolve_reward
from sc_app.rl.hf.tasks import JsonlTask, RepeatFirstTask, TokenTask
from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings


class HFTrainerBackend:
    fields = ("tokens", "attention_mask", "response_mask", "logprobs", "advantage")

    def __init__(self, cfg: AppConfig, rank: int, world_size: int, device: torch.device) -> None:
        assert cfg.model.path is not None
        torch.manual_seed(cfg.run.seed)
        settings = TrainerSettings(
            model_path=cfg.model.path,
            dtype=cfg.model.dtype,
            strategy=cfg.trainer.strategy,
            learning_rate=cfg.grpo.learning_rate,
            temperature=cfg.grpo.temperature,
            prompt_len=cfg.task.prompt_len,
            micro_batch_rows=cfg.trainer.micro_batch_rows,
            max_grad_norm=cfg.grpo.max_grad_norm,
            warm_capture_buffers=cfg.checkpoint.enabled,
        )
        self.trainer = HFTrainer(settings, rank, world_size, device)

    @property
    def version(self) -> int:
        return self.trainer.version

    def train_step(self, rows: TensorDict, version: int) -> TrainStepResult:
        batch = TrainBatch(
            tokens=rows["tokens"],
            attention_mask=rows["attention_mask"],
            response_mask=rows["response_mask"],
            logprobs=rows["logprobs"],
            advantage=rows["advantage"],
        )
        stats = self.trainer.train_step(batch, version)
        return TrainStepResult(loss=stats.loss, rows=stats.rows)

    def capture(self) -> int:
        return self.trainer.capture()

    def write_captured(self, policy_dir: Path) -> dict[str, FileRecord]:
        return dict(self.trainer.write_captured(policy_dir).files)

    def load(self, policy_dir: Path, expected: Mapping[str, str]) -> int:
        return self.trainer.load(policy_dir, expected).version

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        return self.trainer.full_weights()

    def fingerprint(self) -> PolicyFingerprint | None:
        return self.trainer.fingerprint()


class HFGenerationBackend:
    def __init__(self, cfg: AppConfig, worker_index: int, dataset_sha256: str | None) -> None:
        assert cfg.model.path is not None
        torch.manual_seed(cfg.run.seed * 1000 + worker_index)  # generate() samples from torch's global generator
        self.cfg = cfg
        device = device_for(cfg.generation.num_gpus)
        model_dir = check_model_dir(cfg.model.path)
        tokenizer = load_tokenizer(model_dir)
        self.engine = build_engine(cfg, model_dir, tokenizer, device, worker_index)  # generation.engine: hf | vllm
        self.params = SamplingParams(
            temperature=cfg.grpo.temperature,
            top_k=cfg.generation.top_k,
            top_p=cfg.generation.top_p,
            max_new_tokens=cfg.task.response_len,
        )
        self.task: TokenTask
        if cfg.task.name == "jsonl":
            assert cfg.task.path is not None
            dataset = load_jsonl(cfg.task.path, shuffle=cfg.task.shuffle, seed=cfg.run.seed)
            if dataset_sha256 is not None and dataset.sha256 != dataset_sha256:
                raise DatasetError(
                    f"task.path {cfg.task.path} on generation worker {worker_index} is not the file the driver "
                    "checked (its sha256 differs): every node must see the same dataset file"
                )
            reward = resolve_reward(cfg.task.reward)
            self.task = JsonlTask(
                tokenizer, dataset, reward, prompt_len=cfg.task.prompt_len, response_len=cfg.task.response_len
            )
        else:
            self.task = RepeatFirstTask(
                tokenizer,
                seed=cfg.run.seed,
                prompt_len=cfg.task.prompt_len,
                response_len=cfg.task.response_len,
                dataset_size=cfg.task.dataset_size,
            )

    @property
    def version(self) -> int:
        return self.engine.version

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(weights, version)

    def generate(self, prompt_indices: list[int]) -> Rollout:
        group_size = self.cfg.grpo.group_size
        out = self.engine.generate(self.task.prompts(prompt_indices), group_size, self.params)
        per_row = [i for i in prompt_indices for _ in range(group_size)]
        responses = out.tokens[:, self.cfg.task.prompt_len :]
        fields = {
            "tokens": out.tokens,
            "attention_mask": out.attention_mask,
            "response_mask": out.response_mask,
            "logprobs": out.logprobs,
            "reward": self.task.rewards(per_row, responses, out.response_mask),
        }
        return Rollout(fields, out.version)
