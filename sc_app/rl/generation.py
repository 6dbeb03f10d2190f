"""Generation workers: Ray actors around a generation backend (``sc_app.rl.backend``) that sample groups of
responses and score them with the task's reward; the controller commits what they return."""

from __future__ import annotations

from collections.abc import Mapping

import ray
import torch

from sc_app.config.app import AppConfig
from sc_app.rl.backend import GenerationBackend, Rollout
from sc_app.rl.factory import make_generation_backend


@ray.remote
class GenerationWorker:
    """``setup`` builds the backend (not ``__init__``: an error there reaches the driver as itself, one line)."""

    def __init__(self, cfg_json: str, worker_index: int) -> None:
        torch.set_num_threads(1)
        self.cfg = AppConfig.model_validate_json(cfg_json)
        self.worker_index = worker_index
        self._backend: GenerationBackend | None = None

    def setup(self, dataset_sha256: str | None = None) -> None:
        """``dataset_sha256``: the dataset the driver checked; other bytes on this node refuse to start."""
        self._backend = make_generation_backend(self.cfg, self.worker_index, dataset_sha256)

    @property
    def backend(self) -> GenerationBackend:
        if self._backend is None:
            raise RuntimeError("GenerationWorker.setup() was not called")
        return self._backend

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> int:
        self.backend.set_weights(weights, version)
        return version

    def generate(self, prompt_indices: list[int]) -> Rollout:
        """``len(prompt_indices) * group_size`` rows, grouped contiguously per prompt."""
        with torch.no_grad():
            return self.backend.generate(prompt_indices)
