"""Generation workers: Ray actors around a generation backend (``sc_app.rl.backend``) that sample groups of
responses and score them with the task's reward; the controller commits what they return."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace

import ray
import torch

from sc_app.config.app import AppConfig
from sc_app.rl.backend import GenerationBackend, Rollout, WorkerReset
from sc_app.rl.factory import make_generation_backend
from sc_app.rl.fencing import EpochFence


@ray.remote
class GenerationWorker:
    """``setup`` builds the backend (not ``__init__``: an error there reaches the driver as itself, one line).
    ``set_weights`` and ``generate`` are fenced (``sc_app.rl.fencing``): a call from before the last ``reset`` is
    refused and counted."""

    def __init__(self, cfg_json: str, worker_index: int) -> None:
        torch.set_num_threads(1)
        self.cfg = AppConfig.model_validate_json(cfg_json)
        self.worker_index = worker_index
        self._backend: GenerationBackend | None = None
        self.fence = EpochFence()

    def setup(self, dataset_sha256: str | None = None) -> None:
        """``dataset_sha256``: the dataset the driver checked; other bytes on this node refuse to start."""
        self._backend = make_generation_backend(self.cfg, self.worker_index, dataset_sha256)

    @property
    def backend(self) -> GenerationBackend:
        if self._backend is None:
            raise RuntimeError("GenerationWorker.setup() was not called")
        return self._backend

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int, epoch: int | None = None) -> int:
        self.fence.admit(epoch, "set_weights")
        self.backend.set_weights(weights, version)
        return version

    def generate(self, prompt_indices: list[int], epoch: int | None = None) -> Rollout:
        """``len(prompt_indices) * group_size`` rows, grouped contiguously per prompt, stamped with ``epoch``."""
        self.fence.admit(epoch, "generate")
        with torch.no_grad():
            out = self.backend.generate(prompt_indices)
        return replace(out, epoch=epoch)

    def reset(self, epoch: int) -> WorkerReset:
        """A warm in-job restore keeps this engine: from now on calls of an older epoch are refused (a call of
        the old job still queued here is dropped that way; the one running finished before this, one call at a
        time). The bundle's weights arrive next through the weight sync, before any new generate call."""
        self.fence.advance(epoch)
        return WorkerReset(os.getpid(), self.backend.version, self.fence.refused)

    def pid(self) -> int:
        return os.getpid()
