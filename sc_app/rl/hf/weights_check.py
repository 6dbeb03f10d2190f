"""The safetensors weights of a model directory, checked before Ray starts: every header complete and consistent,
and the tensors exactly the ones the model of ``config.json`` has (by name and shape).

Without this a header that lists no tensors (or misses some) loads as a randomly initialised model, silently; a
corrupt header is found only once workers load it, after Ray started and the lease was taken. Headers are read
with the bounded regular-file reader (never a FIFO, never more than ``MAX_HEADER_BYTES``) and parsed with
``strict_json``; the expected tensors come from the model built on the meta device (no weights allocated).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from sc_app.io import strict_json
from sc_app.io.safe_files import FileProblem, open_regular
from sc_app.rl.hf.model_dir import ModelDir, ModelDirError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8,
}  # fmt: skip


@dataclass(frozen=True)
class TensorEntry:
    file: str
    dtype: str
    shape: tuple[int, ...]


def _bad(model_dir: ModelDir, name: str, why: str) -> ModelDirError:
    return ModelDirError(
        f"model.path {model_dir.path}: {name} is not a usable safetensors file ({why}); copy the weights again"
    )


def read_header(model_dir: ModelDir, name: str) -> dict[str, TensorEntry]:
    """The tensors ``name`` holds; ``ModelDirError`` for any header the safetensors loader would refuse."""
    try:
        fd = open_regular(model_dir.path / name, follow=True)
    except FileProblem as exc:
        raise ModelDirError(f"model.path: {exc}; put the weights file there") from None
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise _bad(model_dir, name, f"{size} bytes, shorter than a header")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise _bad(model_dir, name, f"its header claims {n} bytes of a {size}-byte file")
        raw = os.pread(fd, n, 8)
    except OSError as exc:
        raise _bad(model_dir, name, f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        doc = strict_json.parse(raw)
    except ValueError as exc:
        raise _bad(model_dir, name, f"header: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad(model_dir, name, "header is not a JSON object")
    return _entries(model_dir, name, doc, size - 8 - n)


def _entries(model_dir: ModelDir, name: str, doc: dict[str, Any], data_bytes: int) -> dict[str, TensorEntry]:
    out: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for key, info in doc.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
            if dtype not in DTYPE_BYTES or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise TypeError
            if not (isinstance(begin, int) and isinstance(end, int)) or not 0 <= begin <= end:
                raise TypeError
        except (TypeError, ValueError, KeyError):
            raise _bad(model_dir, name, f"tensor {key!r}: no dtype/shape/data_offsets sc-app can read") from None
        count = 1
        for d in shape:
            count *= d
        if end - begin != count * DTYPE_BYTES[dtype]:
            raise _bad(model_dir, name, f"tensor {key!r}: {end - begin} bytes for {dtype} {list(shape)}")
        spans.append((begin, end, key))
        out[key] = TensorEntry(name, dtype, tuple(shape))
    at = 0
    for begin, end, key in sorted(spans):
        if begin != at:
            raise _bad(model_dir, name, f"tensor {key!r} starts at byte {begin}, expected {at} (gap or overlap)")
        at = end
    if at != data_bytes:
        raise _bad(model_dir, name, f"the tensors cover {at} of its {data_bytes} data bytes (truncated or padded)")
    return out


def stored_tensors(model_dir: ModelDir) -> dict[str, TensorEntry]:
    """Every tensor of every weights file (the single file, or every shard of the index, as the index maps them)."""
    out: dict[str, TensorEntry] = {}
    for name in model_dir.weights:
        if name.endswith(".index.json"):
            continue
        for key, entry in read_header(model_dir, name).items():
            if key in out:
                raise _bad(model_dir, name, f"tensor {key!r} is stored in {out[key].file} too")
            out[key] = entry
    for key, shard in model_dir.weight_map.items():
        if key not in out or out[key].file != shard:
            raise ModelDirError(
                f"model.path {model_dir.path}: the index places {key} in {shard}, which does not hold it; "
                "copy the weights again"
            )
    return out


@dataclass(frozen=True)
class Expected:
    shapes: dict[str, tuple[int, ...]]  # the model's state: name → shape
    groups: list[set[str]]  # tied names: any one of a group may be stored
    ignore_missing: tuple[str, ...]  # the model class's own patterns transformers ignores on load
    ignore_unexpected: tuple[str, ...]

    def ignored(self, key: str, patterns: tuple[str, ...]) -> bool:
        return any(re.search(p, key) for p in patterns)


def expected_tensors(model_dir: ModelDir) -> Expected:
    """What the model of ``config.json`` holds, built on the meta device (no memory)."""
    from sc_app.rl.hf.policy_check import meta_model

    model = meta_model(model_dir.config)
    state = model.state_dict(keep_vars=True)
    groups: dict[int, set[str]] = {}
    for key, tensor in state.items():
        groups.setdefault(id(tensor), set()).add(key)
    return Expected(
        {k: tuple(v.shape) for k, v in state.items()},
        list(groups.values()),
        tuple(getattr(model, "_keys_to_ignore_on_load_missing", None) or ()),
        tuple(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()),
    )


def check_weights(model_dir: ModelDir) -> None:
    """``ModelDirError`` naming the missing, unexpected or mis-shaped tensors; before any worker loads the model."""
    stored = stored_tensors(model_dir)
    try:
        want = expected_tensors(model_dir)
    except Exception as exc:  # transformers on an arbitrary config: whatever it raises means "cannot build it"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelDirError(
            f"model.path {model_dir.path}: config.json does not describe a causal LM transformers builds ({first})"
        ) from None
    shapes = want.shapes
    missing = sorted(
        min(g) for g in want.groups if not g & set(stored) and not all(want.ignored(k, want.ignore_missing) for k in g)
    )
    unexpected = sorted(k for k in set(stored) - set(shapes) if not want.ignored(k, want.ignore_unexpected))
    wrong = sorted(k for k in set(stored) & set(shapes) if stored[k].shape != shapes[k])
    if not (missing or unexpected or wrong):
        return
    parts = [
        f"missing {_names(missing)}" if missing else "",
        f"unexpected {_names(unexpected)}" if unexpected else "",
        f"wrong shape {_names(wrong)} (e.g. {wrong[0]}: {list(stored[wrong[0]].shape)}, the model has "
        f"{list(shapes[wrong[0]])})"
        if wrong
        else "",
    ]
    raise ModelDirError(
        f"model.path {model_dir.path}: the weights do not fit the model of config.json: "
        + "; ".join(p for p in parts if p)
        + " (a missing weight would be randomly initialised); copy the model's own weights"
    )


def _names(keys: list[str], shown: int = 3) -> str:
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more
