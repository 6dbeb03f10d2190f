"""Which backend a worker builds (``model.backend``), and the policy format its bundles record.

The one place that names the backends: the workers call it, no backend imports it, so ``backend`` (the neutral
interface) → backends → this module is the only direction imports take inside the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from sc_app.config.app import AppConfig
    from sc_app.rl.backend import GenerationBackend, TrainerBackend


def make_trainer_backend(cfg: AppConfig, rank: int, world_size: int, device: torch.device) -> TrainerBackend:
    """Pre: with ``world_size > 1`` this rank has joined the trainers' process group."""
    if cfg.model.backend == "hf":
        from sc_app.rl.hf.backend import HFTrainerBackend

        return HFTrainerBackend(cfg, rank, world_size, device)
    from sc_app.rl.tiny_backend import TinyTrainerBackend

    return TinyTrainerBackend(cfg, rank, world_size, device)


def make_generation_backend(cfg: AppConfig, worker_index: int, dataset_sha256: str | None) -> GenerationBackend:
    """``dataset_sha256``: the dataset the driver checked; a worker that reads other bytes refuses to start."""
    if cfg.model.backend == "hf":
        from sc_app.rl.hf.backend import HFGenerationBackend

        return HFGenerationBackend(cfg, worker_index, dataset_sha256)
    from sc_app.rl.tiny_backend import TinyGenerationBackend

    return TinyGenerationBackend(cfg, worker_index)


def policy_format(cfg: AppConfig) -> str | None:
    """The ``policy_format`` a bundle's manifest records for ``cfg``'s backend (None: the default, tiny's)."""
    if cfg.model.backend == "hf":
        from sc_app.rl.hf.policy_ckpt import POLICY_FORMAT

        return POLICY_FORMAT
    return None


def prepare_policy_check(cfg: AppConfig) -> None:
    """Build, once per process, what a bundle of ``cfg``'s run is checked against (its model on the meta device and
    the optimizer's structure), so that a restore's re-plan, which checks the newest bundle, does not pay for the
    first build (it imports ``torch._dynamo``: ~1 s for the tiny model, ~3 s with transformers). Raises what
    reading the model's config raises; the check itself reports the same problem where it matters."""
    if cfg.model.backend == "hf":
        from sc_app.rl.hf.policy_check import prepare
    else:
        from sc_app.rl.state_schema import prepare
    prepare(cfg)
