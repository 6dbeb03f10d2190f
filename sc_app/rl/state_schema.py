"""What ``policy/model.pt`` and ``policy/optimizer.pt`` must hold (policy format ``sc-app/torch-v1``, the tiny model).

One validator per file — ``check_model_state``, ``check_optimizer_state`` — used by the trainer's restore
(``TrainerWorker.load``, against the model and optimizer it built) and by verification (``check_policy_dir``,
registered in ``sc_app.checkpoint.policy_formats``, against a model and optimizer of the config the manifest records,
built on the ``meta`` device: no memory, no weights). Both compare with the same ``PolicyTemplate``, so a policy that
verifies is one the trainer loads and trains on: every weight present with its shape and dtype, nothing else; the
optimizer's groups, hyperparameters and per-parameter state shaped like the optimizer the trainer builds
(``new_optimizer``), so neither ``load_state_dict`` nor the first step after a resume can fail on it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ValidationError

from sc_app.checkpoint import layout
from sc_app.checkpoint.compat import compat_of
from sc_app.config.app import AppConfig, ModelConfig
from sc_app.io.safe_files import FileProblem
from sc_app.rl.model import TinyCausalLM

if TYPE_CHECKING:
    from sc_app.checkpoint.policy_formats import PolicyCheck

MAX_POLICY_FILE_BYTES = 8 * 1024**3  # read whole into memory by verification
FILES = (layout.MODEL_FILE, layout.OPTIMIZER_FILE)


class PolicyStateError(ValueError):
    """A policy file that the trainer must not load (the message says what is wrong, not which file)."""


def new_optimizer(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The trainer's optimizer; verification builds the same one to know what a saved one must look like."""
    return torch.optim.Adam(params, lr=lr)


@dataclass(frozen=True)
class PolicyTemplate:
    """What a saved policy must match: the model's state entries and the optimizer's structure."""

    weights: dict[str, tuple[tuple[int, ...], torch.dtype]]  # state_dict name → (shape, dtype)
    param_shapes: list[tuple[int, ...]]  # optimizer param index → shape (``model.parameters()`` order)
    groups: list[dict[str, Any]]  # each param group as a fresh optimizer's state_dict has it
    state_keys: frozenset[str]  # what the optimizer keeps per parameter once it stepped

    @classmethod
    def of(cls, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> PolicyTemplate:
        weights = {k: (tuple(v.shape), v.dtype) for k, v in model.state_dict().items()}
        shapes = [tuple(p.shape) for p in model.parameters()]
        groups = [dict(g) for g in optimizer.state_dict()["param_groups"]]
        probe = torch.nn.Parameter(torch.zeros(1))
        probe_opt = type(optimizer)([probe], **{k: v for k, v in groups[0].items() if k != "params"})
        probe.grad = torch.zeros(1)
        probe_opt.step()
        return cls(weights, shapes, groups, frozenset(probe_opt.state[probe]))

    @classmethod
    def for_config(cls, cfg: ModelConfig, lr: float = 1e-3) -> PolicyTemplate:
        with torch.device("meta"):
            model = TinyCausalLM(cfg)
        return cls.of(model, new_optimizer(model.parameters(), lr))


@functools.lru_cache(maxsize=4)
def _template(model_json: str) -> PolicyTemplate:
    return PolicyTemplate.for_config(ModelConfig.model_validate_json(model_json))


def template_for(model_keys: dict[str, Any]) -> PolicyTemplate:
    """The template of the model config ``model_keys`` (a manifest's ``compat`` ``model.*``, prefix removed), built
    once per process per config and shared (read only): the first build imports ``torch._dynamo`` (a meta model's
    init and any ``torch.optim`` optimizer do), about a second. ``ValidationError`` for keys that are no model
    config."""
    return _template(ModelConfig.model_validate(model_keys).model_dump_json())


def model_keys_of(compat: dict[str, Any]) -> dict[str, Any]:
    return {k.removeprefix("model."): v for k, v in compat.items() if k.startswith("model.")}


def prepare(cfg: AppConfig) -> None:
    """Build the template ``cfg``'s bundles are checked against now (``sc_app.rl.factory.prepare_policy_check``)."""
    template_for(model_keys_of(compat_of(cfg)))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _names(keys: Iterable[Any], limit: int = 3) -> str:
    shown = sorted(map(str, keys))
    return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def _check_tensor(where: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise PolicyStateError(f"{where} is {type(value).__name__}, not a tensor")
    if value.layout != torch.strided or value.is_nested or value.is_meta:
        raise PolicyStateError(f"{where} is not a dense tensor ({value.layout})")
    return value


def check_model_state(obj: Any, template: PolicyTemplate) -> dict[str, Any]:
    """``{"model": {name: tensor}, "version": int}`` with exactly the template's names, shapes and dtypes."""
    if not isinstance(obj, dict) or set(obj) != {"model", "version"}:
        keys = _names(obj) if isinstance(obj, dict) else type(obj).__name__
        raise PolicyStateError(f"holds {keys}, expected a mapping of 'model' and 'version'")
    if not _is_int(obj["version"]) or obj["version"] < 0:
        raise PolicyStateError(f"version {obj['version']!r} is not a non-negative integer")
    weights = obj["model"]
    if not isinstance(weights, dict):
        raise PolicyStateError(f"'model' is {type(weights).__name__}, not a mapping of weights")
    missing, extra = set(template.weights) - set(weights), set(weights) - set(template.weights)
    if missing or extra:
        raise PolicyStateError(
            "weights do not fit the configured model"
            + (f"; missing {_names(missing)}" if missing else "")
            + (f"; unexpected {_names(extra)}" if extra else "")
        )
    for name, (shape, dtype) in template.weights.items():
        t = _check_tensor(f"weight {name!r}", weights[name])
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise PolicyStateError(
                f"weight {name!r} is {tuple(t.shape)} {t.dtype}, the configured model has {shape} {dtype}"
            )
    return obj


def _same_kind(saved: Any, want: Any) -> bool:
    if want is None or isinstance(want, bool):
        return saved is None or isinstance(saved, bool)
    if _is_number(want):
        return _is_number(saved) or (isinstance(saved, torch.Tensor) and saved.numel() == 1)
    if isinstance(want, tuple | list):
        return (
            isinstance(saved, tuple | list)
            and len(saved) == len(want)
            and all(_same_kind(s, w) for s, w in zip(saved, want, strict=True))
        )
    return type(saved) is type(want)


def check_optimizer_state(obj: Any, template: PolicyTemplate) -> dict[str, Any]:
    """An optimizer ``state_dict()`` of the trainer's optimizer over the template's parameters."""
    if not isinstance(obj, dict) or set(obj) != {"state", "param_groups"}:
        keys = _names(obj) if isinstance(obj, dict) else type(obj).__name__
        raise PolicyStateError(f"holds {keys}, expected an optimizer state_dict ('state', 'param_groups')")
    groups, state = obj["param_groups"], obj["state"]
    if not isinstance(groups, list) or len(groups) != len(template.groups):
        raise PolicyStateError(f"param_groups is not a list of {len(template.groups)} group(s)")
    indices: list[Any] = []
    for i, (group, want) in enumerate(zip(groups, template.groups, strict=True)):
        if not isinstance(group, dict) or set(group) != set(want):
            keys = _names(group, 20) if isinstance(group, dict) else type(group).__name__
            raise PolicyStateError(f"param group {i} holds {keys}, the trainer's optimizer has {_names(want, 20)}")
        for key, value in group.items():
            if key != "params" and not _same_kind(value, want[key]):
                raise PolicyStateError(f"param group {i}: {key} is {value!r}, not like the trainer's {want[key]!r}")
        if not isinstance(group["params"], list):
            raise PolicyStateError(f"param group {i}: params is not a list")
        indices.extend(group["params"])
    n = len(template.param_shapes)
    if indices != list(range(n)):
        raise PolicyStateError(f"param groups index {len(indices)} parameters, the configured model has {n}")
    if not isinstance(state, dict):
        raise PolicyStateError("'state' is not a mapping")
    for idx, per_param in state.items():
        if not _is_int(idx) or not 0 <= idx < n:
            raise PolicyStateError(f"state for parameter {idx!r}, which the configured model does not have")
        if not isinstance(per_param, dict) or set(per_param) != template.state_keys:
            keys = _names(per_param) if isinstance(per_param, dict) else type(per_param).__name__
            raise PolicyStateError(f"state of parameter {idx} holds {keys}, expected {_names(template.state_keys)}")
        for key, value in per_param.items():
            if _is_number(value):
                continue
            t = _check_tensor(f"state {key!r} of parameter {idx}", value)
            if t.dim() and tuple(t.shape) != template.param_shapes[idx]:
                raise PolicyStateError(
                    f"state {key!r} of parameter {idx} is {tuple(t.shape)}, the parameter is "
                    f"{template.param_shapes[idx]}"
                )
    return obj


def check_policy_dir(ctx: PolicyCheck) -> list[str]:
    """The ``sc-app/torch-v1`` checker (``sc_app.checkpoint.policy_formats``): ``model.pt`` and ``optimizer.pt``
    checked against a model of the config recorded in the manifest's ``compat`` (``model.*``), nothing else."""
    compat = ctx.manifest.compat
    model_keys = model_keys_of(compat)
    manifest_at = ctx.files.at(layout.MANIFEST_FILE)
    if not model_keys:
        return [f"{manifest_at}: records no model.* config in 'compat'; the policy cannot be checked against a model"]
    try:
        template = template_for(model_keys)
    except (ValidationError, ValueError, TypeError) as exc:
        return [f"{manifest_at}: compat's model.* is not a model config ({str(exc).splitlines()[0]})"]
    problems: list[str] = []
    prefix = f"{ctx.policy_dir}/"
    for name, check in zip(FILES, (check_model_state, check_optimizer_state), strict=True):
        rel = prefix + name
        try:
            check(ctx.files.load_pt(rel, MAX_POLICY_FILE_BYTES), template)
        except FileProblem as exc:
            problems.append(str(exc))
        except PolicyStateError as exc:
            problems.append(f"{ctx.files.at(rel)}: {exc}")
    for rel in sorted(set(ctx.files.listed(prefix)) - {prefix + f for f in FILES}):
        problems.append(f"{ctx.files.at(rel)}: not a file of policy format sc-app/torch-v1")
    return problems
