"""What a bundle must share with the config that resumes it (checked by verify/preflight and the driver)."""

from __future__ import annotations

from typing import Any

from sc_app.config import AppConfig


def compat_of(cfg: AppConfig) -> dict[str, Any]:
    """Config keys whose change makes an existing bundle unresumable, named as config keys."""
    return {
        "run.seed": cfg.run.seed,
        "data_plane.partition": cfg.data_plane.partition,
        "data_plane.storage_units": cfg.data_plane.storage_units,
        "grpo.num_generations_per_prompt": cfg.grpo.num_generations_per_prompt,
        "task.name": cfg.task.name,
        "task.prompt_len": cfg.task.prompt_len,
        "task.response_len": cfg.task.response_len,
        **{f"model.{k}": v for k, v in cfg.model.model_dump().items()},
    }
