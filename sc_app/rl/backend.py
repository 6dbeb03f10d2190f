"""What a trainer worker and a generation worker hold: a backend (``tiny`` or ``hf``), behind one interface each.

The Ray actors (``trainer.TrainerWorker``, ``generation.GenerationWorker``) own the process-level concerns — the
data-plane client, the io thread, the process group — and delegate the model work to a backend chosen by
``model.backend`` (``factory``). The controller sees only the typed results here, whichever backend runs. This
module is backend-neutral: it imports no backend, so every backend imports it and nothing here imports back.

Invariants every trainer backend keeps: ``capture`` copies this rank's state inside the step (training goes on
as soon as it returns); ``write_captured`` writes only that copy and is safe on a thread of its own;
``full_weights`` returns the whole model on rank 0 (None elsewhere) and is collective where the state is sharded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from sc_app.rl import gpu_floor
from sc_app.rl.hooks import InputError

if TYPE_CHECKING:
    from tensordict import TensorDict

    from sc_app.checkpoint.writer import FileRecord


@dataclass(frozen=True)
class TrainStepResult:
    loss: float
    rows: int
    get_seconds: float = 0.0  # reading the step's rows from the data plane (set by the trainer worker)


@dataclass(frozen=True)
class Rollout:
    """``len(prompt_indices) * group_size`` rows, grouped contiguously per prompt: the data-plane fields to commit
    (always ``reward``; the rest is what the backend's trainer reads) and the weights version that generated them."""

    fields: dict[str, torch.Tensor]
    version: int
    epoch: int | None = None  # the fencing epoch of the call that produced it (sc_app.rl.fencing); None: unfenced


@dataclass(frozen=True)
class WorkerReset:
    """What a worker reset in place by a warm in-job restore reports: its process (kept), the weights version it
    held before the reset, and how many calls from an older epoch it refused so far."""

    pid: int
    version_before: int
    refused: int


@dataclass(frozen=True)
class PolicyFingerprint:
    """sha256 over the whole (unsharded) weights and optimizer state: equal across world sizes and strategies."""

    weights: str
    optimizer: str


class TrainerBackend(Protocol):
    fields: tuple[str, ...]  # the data-plane fields ``train_step`` reads
    version: int

    def train_step(self, rows: TensorDict, version: int) -> TrainStepResult: ...

    def capture(self) -> int: ...

    def write_captured(self, policy_dir: Path) -> dict[str, FileRecord]: ...

    def load(self, policy_dir: Path, expected: Mapping[str, str]) -> int: ...

    def full_weights(self) -> dict[str, torch.Tensor] | None: ...

    def fingerprint(self) -> PolicyFingerprint | None: ...


class GenerationBackend(Protocol):
    version: int

    def set_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None: ...

    def generate(self, prompt_indices: list[int]) -> Rollout: ...


class GpuUnusable(InputError):
    """A worker given GPUs on a node that cannot run the image's CUDA build (``gpu_floor``): one line, exit 2."""


def probe_gpu(num_gpus: float) -> gpu_floor.GpuReport:
    """What torch.cuda and nvidia-smi (mounted by the NVIDIA container toolkit; absent is fine) report here."""
    smi = None
    try:
        proc = subprocess.run(gpu_floor.SMI_QUERY, capture_output=True, text=True, timeout=30, check=False)
        smi = gpu_floor.parse_smi(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        smi = None
    available = torch.cuda.is_available()
    caps = [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())] if available else []
    return gpu_floor.GpuReport(num_gpus, torch.__version__, torch.version.cuda, available, caps, smi)  # type: ignore[arg-type]


def device_for(num_gpus: float) -> torch.device:
    """CUDA when this worker is given GPUs; ``GpuUnusable`` (one line) when the node cannot run the image's CUDA
    build (driver below the floor, compute capability too low, a CPU torch, no visible device) instead of the
    silent CPU fallback that trained a GPU job on a CPU."""
    if num_gpus <= 0:
        return torch.device("cpu")
    problem = gpu_floor.check(probe_gpu(num_gpus))
    if problem is not None:
        raise GpuUnusable(problem)
    return torch.device("cuda")
