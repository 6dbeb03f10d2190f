"""A fingerprint of the full (unsharded) policy state: sha256 over every weight and every optimizer entry.

The same state gives the same fingerprint whatever world size or strategy holds it, so a resume onto a
different number of trainers can be checked bit for bit against the bundle it loaded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch

from sc_app.rl.backend import PolicyFingerprint


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return f"{t.dtype}:{tuple(t.shape)}:".encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def weights_sha256(state: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        h.update(key.encode() + b"\0" + _tensor_bytes(state[key]))
    return h.hexdigest()


def optimizer_sha256(state: Mapping[str, Any]) -> str:
    """Over ``{"state": {fqn: {name: tensor | number}}, "param_groups": [...]}`` (DCP's FQN-keyed form)."""
    h = hashlib.sha256()
    for fqn in sorted(state.get("state", {})):
        entry = state["state"][fqn]
        for name in sorted(entry):
            value = entry[name]
            h.update(f"{fqn}.{name}\0".encode())
            h.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else repr(value).encode())
    groups = [{k: v for k, v in sorted(g.items())} for g in state.get("param_groups", [])]
    h.update(json.dumps(groups, sort_keys=True, default=repr).encode())
    return h.hexdigest()


def full_fingerprint(model: Any, optimizer: Any) -> PolicyFingerprint | None:
    """Collective over the trainers' process group (when there is one); rank 0 gets the fingerprint, others None."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=options)
    osd = get_optimizer_state_dict(model, optimizer, options=options)
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return PolicyFingerprint(weights_sha256(msd), optimizer_sha256(osd))
