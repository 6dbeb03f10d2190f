"""A local Hugging Face model directory: checked, then loaded with ``transformers`` — never downloaded.

``check_model_dir`` names what is missing in one line (``ModelDirError``) before ``transformers`` is asked to
load anything: the directory itself, ``config.json``, the safetensors weights (a sharded index and every shard
it lists), the tokenizer files. Only safetensors weights are loaded (no pickled ``.bin``), remote code is never
trusted, and the path is always a directory, so it can never be mistaken for a Hub repository id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sc_app.io import strict_json
from sc_app.io.safe_files import FileProblem, read_regular, show, unsafe_rel
from sc_app.rl.hf.errors import HFInputError

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".index.json")
MODEL_FILES_MAX_BYTES = 64 * 1024 * 1024  # config + tokenizer files copied into every bundle: refuse surprises

DTYPES = ("auto", "float32", "bfloat16", "float16")


class ModelDirError(HFInputError):
    """A model directory that cannot be loaded; ``str()`` is one line naming the path, what is wrong and what to do."""


@dataclass(frozen=True)
class ModelDir:
    """A checked model directory: the files a load will read."""

    path: Path
    weights: tuple[str, ...]
    tokenizer: tuple[str, ...]
    config: dict[str, Any]
    weight_map: dict[str, str] = field(default_factory=dict)  # a sharded index's tensor → shard file

    @property
    def max_positions(self) -> int | None:
        for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            if isinstance(self.config.get(key), int):
                return int(self.config[key])
        return None


def _fail(path: Path, problem: str, todo: str) -> ModelDirError:
    return ModelDirError(f"model.path {path}: {problem}; {todo}")


def check_model_dir(path: str | Path) -> ModelDir:
    """Every file a load needs is present and non-empty; raises ``ModelDirError`` naming the first gap."""
    p = Path(path)
    todo = "put a Hugging Face model directory there (config.json, *.safetensors, tokenizer files)"
    if not p.exists():
        raise _fail(p, "does not exist", todo)
    if not p.is_dir():
        raise _fail(p, "is not a directory", todo)
    cfg_path = p / CONFIG_FILE
    if not cfg_path.is_file():
        raise _fail(p, f"{CONFIG_FILE} is missing", todo)
    config = _read_json(p, CONFIG_FILE)
    if not isinstance(config, dict) or not (config.get("model_type") or config.get("architectures")):
        raise _fail(p, f"{CONFIG_FILE} names no model_type", "restore the model's own config.json")
    if config.get("auto_map"):
        raise _fail(p, "the model needs its own Python code (auto_map)", "use a model transformers supports natively")
    weights, weight_map = _weight_files(p)
    tokenizer = tuple(name for name in TOKENIZER_FILES if (p / name).is_file())
    if not tokenizer:
        raise _fail(p, f"no tokenizer file ({', '.join(TOKENIZER_FILES)})", "save the tokenizer into the directory")
    for name in (*weights, *tokenizer):
        if (p / name).stat().st_size == 0:
            raise _fail(p, f"{name} is empty", "copy the file again")
    return ModelDir(path=p, weights=weights, tokenizer=tokenizer, config=config, weight_map=weight_map)


def _read_json(p: Path, name: str) -> Any:
    """``name`` in ``p``: a regular file (or a link to one), bounded, any JSON depth or number size one line."""
    try:
        return strict_json.parse(read_regular(p / name, MODEL_FILES_MAX_BYTES, follow=True))
    except FileProblem as exc:
        raise _fail(p, f"{name}: {str(exc).removeprefix(str(p / name) + ': ')}", "restore the file") from None
    except ValueError as exc:
        raise _fail(p, f"{name} is {exc}", "restore the file") from None


def _index_map(p: Path) -> dict[str, str]:
    """The index's weight_map: tensor name → a shard file named inside ``p`` (no absolute path, no '..')."""
    doc = _read_json(p, SAFETENSORS_INDEX)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise _fail(p, f"{SAFETENSORS_INDEX} has no readable weight_map", "restore the file")
    for shard in sorted(set(weight_map.values())):
        why = unsafe_rel(shard)
        if why is not None or not shard.endswith(".safetensors"):
            raise _fail(
                p,
                f"{SAFETENSORS_INDEX} names shard {show(shard)!r}, which "
                + (why.replace("bundle", "model directory") if why else "is not a .safetensors file"),
                "list only shard files inside model.path",
            )
    return weight_map


def _weight_files(p: Path) -> tuple[tuple[str, ...], dict[str, str]]:
    if (p / SAFETENSORS_FILE).is_file():
        return (SAFETENSORS_FILE,), {}
    index = p / SAFETENSORS_INDEX
    if index.exists():
        weight_map = _index_map(p)
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (p / s).is_file()]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise _fail(p, f"weight shard {missing[0]}{more} listed in {SAFETENSORS_INDEX} is missing", "copy it")
        return (SAFETENSORS_INDEX, *shards), weight_map
    if any(p.glob("*.bin")):
        raise _fail(p, "has only pickled .bin weights", "convert them to safetensors (sc-app loads no pickles)")
    raise _fail(p, f"no weights ({SAFETENSORS_FILE} or {SAFETENSORS_INDEX})", "copy the safetensors weights there")


def resolve_dtype(name: str, device_type: str) -> Any:
    """``model.dtype`` → torch dtype; ``auto`` is float32 on CPU and bfloat16 on GPU."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"model.dtype {name!r} is not one of {', '.join(DTYPES)}")
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" else torch.float32
    return getattr(torch, name)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{exc.__class__.__name__}: {text.splitlines()[0]}" if text else exc.__class__.__name__


def _offline() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: nothing may reach the Hub at run time
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def load_model(model_dir: ModelDir, dtype: Any) -> Any:
    """The causal LM from ``model_dir`` on the CPU in ``dtype`` (callers move it)."""
    _offline()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            model_dir.path,
            dtype=dtype,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
        )
    except Exception as exc:  # safetensors, transformers and torch each raise their own types for a bad file
        raise _fail(
            model_dir.path, f"transformers cannot load the model ({_first_line(exc)})", "check the files"
        ) from None
    wrong = {
        k: sorted(map(str, v)) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if (v := info.get(k))
    }
    if wrong:  # a missing weight is randomly initialised: never train or export that silently
        said = "; ".join(
            f"{k.replace('_', ' ')}: {', '.join(v[:3])}{' ...' if len(v) > 3 else ''}" for k, v in wrong.items()
        )
        raise _fail(model_dir.path, f"the weights do not fit the model ({said})", "copy the model's own weights")
    return model


def load_tokenizer(model_dir: ModelDir) -> Any:
    _offline()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_dir.path, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # tokenizers raises its own exception types for a bad file
        raise _fail(
            model_dir.path, f"transformers cannot load the tokenizer ({_first_line(exc)})", "check files"
        ) from None
    if tok.pad_token_id is None and tok.eos_token_id is None:
        raise _fail(model_dir.path, "the tokenizer has neither a pad nor an eos token", "set one in its config")
    return tok


def model_files(model_dir: ModelDir) -> dict[str, bytes]:
    """Every top-level file except weights (config, generation config, tokenizer, chat template): what an export
    needs beside the weights. Read once, so a bundle records the files the run started from."""
    out: dict[str, bytes] = {}
    total = 0
    for entry in sorted(model_dir.path.iterdir()):
        if not entry.is_file() or entry.name.startswith(".") or entry.name.endswith(WEIGHT_SUFFIXES):
            continue
        try:
            data = read_regular(entry, MODEL_FILES_MAX_BYTES, follow=True)
        except FileProblem as exc:
            raise _fail(model_dir.path, str(exc), "keep only regular files beside the weights") from None
        total += len(data)
        if total > MODEL_FILES_MAX_BYTES:
            raise _fail(
                model_dir.path,
                f"non-weight files exceed {MODEL_FILES_MAX_BYTES >> 20} MiB (at {entry.name})",
                "keep only the model's config and tokenizer files beside the weights",
            )
        out[entry.name] = data
    return out
