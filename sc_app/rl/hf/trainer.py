"""The trainer side of the hf backend, one instance per trainer rank (the Ray actor around it owns the data
plane and threads).

* ``train_step``: GRPO's clipped loss (``sc_app.rl.grpo``, shared with the tiny backend) over the response
  tokens of this rank's rows, in micro-batches; gradients averaged (``ddp``) or reduce-scattered (``fsdp``).
  Parameters and optimizer state are float32; forward and backward run in ``model.dtype`` (autocast, or FSDP2's
  mixed-precision policy).
* ``capture`` (training thread, inside the step a bundle is cut at) copies this rank's shard to CPU;
  ``write_captured`` (io thread) writes it with DCP on a gloo group of its own; ``load`` reads any world size.
* ``full_weights`` (collective) gathers the whole model on rank 0, in ``model.dtype``, for the generation workers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sc_app.rl.backend import PolicyFingerprint
from sc_app.rl.fingerprint import full_fingerprint
from sc_app.rl.grpo import clipped_pg_loss
from sc_app.rl.hf import policy_ckpt
from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.model_dir import check_model_dir, load_model, model_files, resolve_dtype
from sc_app.rl.hf.parallel import Strategy, unwrap, wrap_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerSettings:
    model_path: str
    dtype: str = "auto"
    strategy: Strategy = "ddp"
    learning_rate: float = 1e-5
    temperature: float = 1.0
    prompt_len: int = 4
    micro_batch_rows: int = 0  # 0: the whole shard in one forward/backward
    max_grad_norm: float | None = None
    clip: float = 0.2
    warm_capture_buffers: bool = True  # allocate the save's CPU copies after the first step, not at the first save


@dataclass(frozen=True)
class TrainBatch:
    """This rank's rows: ``tokens`` / ``attention_mask`` ``[N, P+R]``; ``response_mask`` / ``logprobs`` ``[N, R]``;
    ``advantage`` ``[N]``."""

    tokens: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    advantage: torch.Tensor


@dataclass(frozen=True)
class StepStats:
    loss: float
    rows: int
    tokens: int
    grad_norm: float | None


class HFTrainer:
    """Pre: with ``world_size > 1`` the default process group is initialised on every rank (constructing the
    trainer is itself collective: it creates the checkpoint group)."""

    def __init__(self, settings: TrainerSettings, rank: int, world_size: int, device: torch.device) -> None:
        self.settings, self.rank, self.world_size, self.device = settings, rank, world_size, device
        model_dir = check_model_dir(settings.model_path)
        self.compute_dtype = resolve_dtype(settings.dtype, device.type)
        self.model_files = model_files(model_dir) if rank == 0 else {}
        model = load_model(model_dir, torch.float32).to(device)
        model.config.use_cache = False
        self.fsdp = settings.strategy == "fsdp" and world_size > 1
        if self.fsdp and self.compute_dtype != torch.float32:
            self.model = self._fully_shard_mixed(model)
        else:
            self.model = wrap_model(model, settings.strategy, world_size, device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=settings.learning_rate)
        # DCP's collectives for saves run on the io thread: give them a group the training thread never uses
        self.ckpt_group = dist.new_group(backend="gloo") if world_size > 1 else None
        self.buffers = policy_ckpt.CaptureBuffers(device)
        self.version = 0
        self._captured: tuple[int, policy_ckpt.CapturedPolicy] | None = None
        self._warm = False

    @property
    def hf_model(self) -> Any:
        """The Hugging Face model itself (inside a DDP wrapper; FSDP2 shards it in place)."""
        return unwrap(self.model)

    def _fully_shard_mixed(self, model: Any) -> Any:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from sc_app.rl.hf.parallel import shard_units

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        return model

    def _autocast(self) -> Any:
        if self.compute_dtype == torch.float32 or self.fsdp:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # ------------------------------------------------------------------------------------------ training
    def train_step(self, batch: TrainBatch, version: int) -> StepStats:
        s = self.settings
        self.model.train()
        n = batch.tokens.shape[0]
        step = s.micro_batch_rows or max(n, 1)
        starts = list(range(0, n, step)) or [0]
        mask = batch.response_mask.to(self.device)
        num_tokens = mask.sum().clamp(min=1).float()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for i, start in enumerate(starts):
            last = i == len(starts) - 1
            rows = slice(start, start + step)
            with self._no_sync(not last):  # forward and backward both inside, as DDP and FSDP2 require
                with self._autocast():
                    new_logp = sequence_logprobs(
                        self.model,
                        batch.tokens[rows].to(self.device),
                        batch.attention_mask[rows].to(self.device),
                        s.prompt_len,
                        s.temperature,
                    )
                loss = clipped_pg_loss(
                    new_logp.float(),
                    batch.logprobs[rows].to(self.device).float(),
                    batch.advantage[rows].to(self.device).float(),
                    s.clip,
                    mask=mask[rows],
                    num_tokens=num_tokens,
                )
                loss.backward()
            total += float(loss.detach())
        grad_norm = None
        if s.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.optimizer.step()
        self.version = version
        if s.warm_capture_buffers and not self._warm:  # the optimizer state exists only after a first step
            self.buffers.warm(self.model, self.optimizer)
            self._warm = True
        return StepStats(loss=total, rows=n, tokens=int(mask.sum()), grad_norm=grad_norm)

    def _no_sync(self, skip_sync: bool) -> Any:
        """Accumulate without communicating on every micro-batch but the last."""
        if not skip_sync or self.world_size == 1:
            return contextlib.nullcontext()
        if self.fsdp:
            return _FsdpNoSync(self.model)
        return self.model.no_sync()

    # ------------------------------------------------------------------------------------------ weights
    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """Collective: the whole model in ``model.dtype`` on rank 0's CPU; None on other ranks."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return {k: v.to(self.compute_dtype) if v.is_floating_point() else v for k, v in sd.items()}

    def fingerprint(self) -> PolicyFingerprint | None:
        """Collective; rank 0 gets the fingerprint of the full state."""
        return full_fingerprint(self.model, self.optimizer)

    # ------------------------------------------------------------------------------------------ checkpoints
    def capture(self) -> int:
        """Copy this rank's shard to CPU (training thread, between steps); returns the captured version."""
        meta = policy_ckpt.policy_meta(self.version, self.settings.strategy, self.world_size)
        self._captured = self.buffers.capture(self.model, self.optimizer, meta)
        return self.version

    def write_captured(self, policy_dir: str | Path) -> policy_ckpt.PolicyWrite:
        """Collective on the checkpoint group (every rank, same ``policy_dir``); safe on a thread of its own."""
        if self._captured is None:
            raise RuntimeError("write_captured() before capture()")
        slot, captured = self._captured
        with self.buffers.writing(slot):
            return policy_ckpt.write(
                captured, policy_dir, rank=self.rank, process_group=self.ckpt_group, model_files=self.model_files
            )

    def load(self, policy_dir: str | Path, expected: Mapping[str, str]) -> policy_ckpt.PolicyMeta:
        """Collective on the training group: restore weights + optimizer state saved by any world size."""
        meta = policy_ckpt.load(self.model, self.optimizer, policy_dir, expected)
        self.version = meta.version
        return meta


class _FsdpNoSync:
    """FSDP2: skip the gradient reduce-scatter for this backward (``set_requires_gradient_sync``)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.model.set_requires_gradient_sync(False)

    def __exit__(self, *exc: object) -> None:
        self.model.set_requires_gradient_sync(True)
