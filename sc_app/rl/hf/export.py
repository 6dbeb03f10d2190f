"""Bundle → Hugging Face directory: the policy's weights as safetensors beside the config and tokenizer files the
run started from, loadable with ``AutoModelForCausalLM.from_pretrained(out)`` and ``AutoTokenizer``.

Every byte read from the bundle is checked against the manifest's digest first (``verified_read.VerifiedReader``);
the export is written into a temporary sibling directory, fsynced, and renamed to ``out`` at the end, so ``out``
is either complete or absent. An existing non-empty ``out`` is refused, never overwritten.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from sc_app.io import hashing
from sc_app.io.durable import fsync_dir, fsync_file, fsync_tree_dirs
from sc_app.io.safe_files import read_regular
from sc_app.rl.hf import policy_ckpt
from sc_app.rl.hf.model_dir import MODEL_FILES_MAX_BYTES, check_model_dir


class ExportError(ValueError):
    """The export cannot be written; one line naming what and what to do."""


@dataclass(frozen=True)
class ExportResult:
    out: Path
    files: tuple[str, ...]
    dtype: str
    parameters: int
    load_with: str = "AutoModelForCausalLM.from_pretrained"  # what ``sc-app export`` tells the user


def _config_dtype(config: object) -> torch.dtype:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)
    return torch.float32


def export_policy(policy_dir: str | Path, expected: Mapping[str, str], out: str | Path) -> ExportResult:
    """Pre: ``expected`` (policy-dir-relative name → labelled digest, ``hashing.label``) comes from a verified
    manifest."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    policy_dir, out = Path(policy_dir), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"--out {out}: exists and is not an empty directory; choose a new path")
    names = sorted(n.split("/", 1)[1] for n in expected if n.startswith(f"{policy_ckpt.MODEL_FILES_DIR}/"))
    if "config.json" not in names:
        raise ExportError(f"{policy_dir}: the bundle holds no model config (hf/config.json); it cannot be exported")
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}")  # racing exports: one each
    try:
        dtype, parameters = _write(policy_dir, expected, names, tmp, out)
    except OSError as exc:  # a full disk, no permission, or another export put ``out`` in place meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        raise ExportError(
            f"--out {out}: the export could not be written ({exc.strerror or exc}); nothing was kept — free space, "
            "or choose a new --out (another export may have written this one meanwhile)"
        ) from None
    files = tuple(sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()))
    return ExportResult(out, files, dtype, parameters)


def _write(policy_dir: Path, expected: Mapping[str, str], names: list[str], tmp: Path, out: Path) -> tuple[str, int]:
    """The export written into ``tmp``, fsynced, then renamed to ``out`` (which must be absent or empty); returns
    the weights' dtype and the parameter count."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        for name in names:
            rel = f"{policy_ckpt.MODEL_FILES_DIR}/{name}"
            (tmp / name).write_bytes(_verified(policy_dir, rel, expected))
        config = AutoConfig.from_pretrained(tmp, local_files_only=True, trust_remote_code=False)
        dtype = _config_dtype(config)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model = model.to_empty(device="cpu")
        model.tie_weights()  # to_empty gives every parameter new storage: tie shared ones again
        template = model.state_dict()
        policy_ckpt.read_model_state(policy_dir, expected, template)
        model = model.to(dtype)
        model.save_pretrained(tmp, safe_serialization=True)
        check_model_dir(tmp)  # what we wrote is a loadable directory
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                fsync_file(p)  # nothing checks a digest of the export: only durability is wanted
        fsync_tree_dirs(tmp)
        os.rename(tmp, out)  # replaces an empty directory; a non-empty one (a racing export's) is ENOTEMPTY
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(dtype).removeprefix("torch."), sum(p.numel() for p in model.parameters())


def _verified(policy_dir: Path, rel: str, expected: Mapping[str, str]) -> bytes:
    data = read_regular(policy_dir / rel, MODEL_FILES_MAX_BYTES)
    if not hashing.bytes_match(data, expected.get(rel)):
        alg = hashing.split_label(expected[rel])[0] if rel in expected else "digest"
        raise policy_ckpt.PolicyIntegrityError(f"{policy_dir / rel}: {alg} does not match the manifest")
    return data


def export_for_cli(policy_dir: Path, expected: Mapping[str, str], out: str | Path) -> ExportResult:
    """``export_policy`` as ``sc-app export`` calls it (``sc_app.rl.hooks.EXPORTERS``): every problem with the
    output, the bundle's bytes or the model files is an ``ExportFailed`` (one line)."""
    from sc_app.rl.hf.errors import HFInputError
    from sc_app.rl.hooks import ExportFailed

    try:
        return export_policy(policy_dir, expected, out)
    except (ExportError, policy_ckpt.PolicyIntegrityError, HFInputError) as exc:
        raise ExportFailed(str(exc)) from None
