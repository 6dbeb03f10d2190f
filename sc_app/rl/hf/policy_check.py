"""The ``sc-app/dcp-v1`` policy checker (``sc_app.checkpoint.policy_formats``): what ``policy/`` of an hf bundle
must hold for the restore to take it, checked without decoding the tensor payloads.

Read, through ``ctx.files`` only (listed, bounded, hash-checked): ``.metadata`` — decoded by the restore's own
allowlist unpickler (``verified_read.decode_metadata``) — and ``hf/config.json``. Checked: every stored item lies
inside a shard file the manifest lists; every entry has storage; the ``model.*`` entries are exactly the state of
the model ``hf/config.json`` describes (names and shapes, built on the ``meta`` device: no memory, no weights); the
optimizer's per-parameter state is Adam's (``exp_avg``, ``exp_avg_sq`` shaped like the parameter, ``step``) for
parameters of that model; its param group and the policy meta are there; ``policy/`` holds nothing else. The
tensor payloads (tens of GB for a large model) are vouched for by their digests, not decoded here.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sc_app.io import strict_json
from sc_app.io.safe_files import FileProblem
from sc_app.rl.hf.policy_ckpt import MODEL_FILES_DIR, POLICY_FORMAT
from sc_app.rl.hf.verified_read import DCP_METADATA_FILE, PolicyIntegrityError

if TYPE_CHECKING:
    from sc_app.checkpoint.policy_formats import PolicyCheck
    from sc_app.config.app import AppConfig

MAX_METADATA_BYTES = 256 * 1024 * 1024
MAX_CONFIG_BYTES = 4 * 1024 * 1024
META_KEYS = frozenset({"meta.format", "meta.format_version", "meta.version", "meta.strategy", "meta.world_size"})
ADAM_STATE = ("exp_avg", "exp_avg_sq", "step")


def _names(keys: Any, limit: int = 3) -> str:
    shown = sorted(map(str, keys))
    return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def meta_model(config: dict[str, Any]) -> Any:
    """The causal LM ``config`` (a config.json's content) describes, on the meta device: shapes, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError("names no model_type")
    cfg = AutoConfig.for_model(model_type, **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(cfg)


Template = tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]


@functools.lru_cache(maxsize=4)
def _model_template(config_json: str) -> Template:
    model = meta_model(json.loads(config_json))
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    params = {k: tuple(p.shape) for k, p in model.named_parameters()}
    return state, params


def model_template(config: dict[str, Any]) -> Template:
    """The state names → shapes and the parameter names → shapes of the model ``config`` describes (meta device),
    built once per process per config and shared (read only): the first build imports transformers' model class
    and ``torch._dynamo`` (a meta model's init does), about three seconds."""
    return _model_template(json.dumps(config, sort_keys=True))


def prepare(cfg: AppConfig) -> None:
    """Build the template ``cfg``'s bundles are checked against now (``sc_app.rl.factory.prepare_policy_check``):
    the model directory's ``config.json``, which every bundle of the run copies into ``policy/hf/``."""
    model_template(strict_json.parse((Path(cfg.model.path or "") / "config.json").read_bytes()))


def check_policy_dir(ctx: PolicyCheck) -> list[str]:
    prefix = f"{ctx.policy_dir}/"
    listed = ctx.files.listed(prefix)
    meta_rel, config_rel = prefix + DCP_METADATA_FILE, f"{prefix}{MODEL_FILES_DIR}/config.json"
    try:
        metadata = _decode(ctx, meta_rel)
        config = strict_json.parse(ctx.files.read(config_rel, MAX_CONFIG_BYTES))
    except FileProblem as exc:
        return [str(exc)]
    except PolicyIntegrityError as exc:
        return [f"{ctx.files.at(meta_rel)}: {exc}"]
    except ValueError:  # strict_json: any depth, any number size, invalid UTF-8
        return [f"{ctx.files.at(config_rel)}: not JSON"]
    if not isinstance(config, dict):
        return [f"{ctx.files.at(config_rel)}: not a JSON object"]
    problems, shards = _check_storage(ctx, metadata, listed, prefix)
    try:
        state, params = model_template(config)
    except Exception as exc:  # transformers on an arbitrary config: whatever it raises is "not a model we can build"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        return [*problems, f"{ctx.files.at(config_rel)}: does not describe a causal LM transformers builds ({first})"]
    at_meta = ctx.files.at(meta_rel)
    problems += [f"{at_meta}: {p}" for p in _check_entries(metadata.state_dict_metadata, state, params)]
    allowed = {meta_rel, *shards}  # nothing else under policy/
    for rel in sorted(listed):
        if rel not in allowed and not rel.startswith(f"{prefix}{MODEL_FILES_DIR}/"):
            problems.append(f"{ctx.files.at(rel)}: not a file of policy format {POLICY_FORMAT}")
    return problems


def _check_storage(ctx: PolicyCheck, metadata: Any, listed: dict[str, Any], prefix: str) -> tuple[list[str], set[str]]:
    """Every stored item lies inside a listed shard file and every entry has stored bytes; returns the problems
    and the shard files the metadata names."""
    at_meta = ctx.files.at(prefix + DCP_METADATA_FILE)
    problems: list[str] = []
    shards: set[str] = set()
    stored: set[str] = set()
    for index, info in metadata.storage_data.items():
        rel = prefix + str(info.relative_path)
        stored.add(index.fqn)
        if "/" in str(info.relative_path) or rel not in listed:
            problems.append(f"{at_meta}: {index.fqn} is stored in {info.relative_path!r}, not a listed shard")
            continue
        shards.add(rel)
        size = int(listed[rel]["size"])
        if info.offset < 0 or info.length < 0 or info.offset + info.length > size:
            problems.append(
                f"{ctx.files.at(rel)}: .metadata places {index.fqn} at bytes {info.offset}.."
                f"{info.offset + info.length}, outside its {size} bytes"
            )
    if unstored := set(metadata.state_dict_metadata) - stored:
        problems.append(f"{at_meta}: no stored bytes for {_names(unstored)}")
    return problems, shards


def _check_entries(
    entries: dict[str, Any], state: dict[str, tuple[int, ...]], params: dict[str, tuple[int, ...]]
) -> list[str]:
    """The entries are exactly the model's state, Adam's state of its parameters, a param group and the policy
    meta (each problem without the file's name, which the caller adds)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    def shape(entry: Any) -> Any:
        return tuple(entry.size) if isinstance(entry, TensorStorageMetadata) else type(entry).__name__

    problems: list[str] = []
    model = {k.removeprefix("model."): v for k, v in entries.items() if k.startswith("model.")}
    missing, extra = set(state) - set(model), set(model) - set(state)
    if missing or extra:
        problems.append(
            f"the weights do not fit the model of {MODEL_FILES_DIR}/config.json"
            + (f"; missing {_names(missing)}" if missing else "")
            + (f"; unexpected {_names(extra)}" if extra else "")
        )
    for name in sorted(set(state) & set(model)):
        if shape(model[name]) != state[name]:
            problems.append(f"weight {name} is {shape(model[name])}, the model has {state[name]}")
    for key, entry in entries.items():
        if key.startswith("model.") or key in META_KEYS or key.startswith("optimizer.param_groups."):
            continue
        fqn, _, part = key.removeprefix("optimizer.state.").rpartition(".")
        if not key.startswith("optimizer.state.") or fqn not in params or part not in ADAM_STATE:
            problems.append(f"{key} is no entry of an sc-app hf policy")
            continue
        want = () if part == "step" else params[fqn]
        if shape(entry) != want:
            problems.append(f"optimizer state {key} is {shape(entry)}, expected {want}")
    for key in sorted(META_KEYS | {"optimizer.param_groups.0.params", "optimizer.param_groups.0.lr"}):
        if not isinstance(entries.get(key), BytesStorageMetadata):
            problems.append(f"{key} is missing")
    return problems


def _decode(ctx: PolicyCheck, rel: str) -> Any:
    from sc_app.rl.hf.verified_read import decode_metadata

    return decode_metadata(ctx.files.read(rel, MAX_METADATA_BYTES))
