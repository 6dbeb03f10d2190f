"""Data-parallel wrapping of the trainer's model: ``ddp`` (replicas, gradients averaged) or ``fsdp`` (FSDP2
``fully_shard``: parameters, gradients and optimizer state sharded across ranks).

Works on CPU over gloo and on GPU over NCCL; with one rank the model is used as is (there is nothing to shard or
average). FSDP shards each decoder layer (the classes the model lists in ``_no_split_modules``) and then the root.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

Strategy = Literal["ddp", "fsdp"]


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP shards one by one: instances of the model's ``_no_split_modules`` classes."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names and m is not model]


def wrap_model(model: nn.Module, strategy: Strategy, world_size: int, device: torch.device) -> nn.Module:
    """Pre: with ``world_size > 1`` the default process group is initialised and ``model`` is on ``device``."""
    if world_size == 1:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if device.type != "cuda":
            return DistributedDataParallel(model)
        index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" means the current
        return DistributedDataParallel(model, device_ids=[index])
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world_size,))
        units = shard_units(model)
        if not units:
            raise ValueError(
                f"{type(model).__name__} lists no _no_split_modules: trainer.strategy=fsdp cannot find its layers; "
                "use trainer.strategy=ddp"
            )
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    raise ValueError(f"trainer.strategy {strategy!r} is not ddp or fsdp")


def unwrap(model: nn.Module) -> Any:
    """The HF model inside a DDP wrapper (FSDP2 shards in place and needs no unwrapping)."""
    return getattr(model, "module", model)
