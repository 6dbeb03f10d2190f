"""Parsing JSON from the volume: bounded depth, finite numbers, and strict schemas. Pure: no Ray, no torch.

Invariants: ``parse`` never raises anything but ``ValueError`` whatever the bytes (any depth — the parser stops at
``pydantic_core``'s recursion limit, about 200 levels, instead of exhausting Python's stack —, invalid UTF-8,
``NaN``/``Infinity``, integers too large to parse, an object with the same key twice: parsers disagree on which
value counts — last, first, or an error —, so a document that says two things is never read as one of them); a
document is accepted by ``validate`` only when it has exactly
the model's keys and types (no coercion: ``true`` is not an integer, ``"1"`` is not a number). Callers bound the
size before they read the bytes.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

HEX64 = re.compile(r"^[0-9a-f]{64}$")

NonNegInt = Annotated[int, Field(ge=0)]
PosInt = Annotated[int, Field(ge=1)]
Hex64 = Annotated[str, StringConstraints(pattern=HEX64.pattern)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=4096)]
Scalar = str | int | float | bool | None

M = TypeVar("M", bound=BaseModel)


class SchemaError(ValueError):
    """A JSON document (or a deserialised object) does not have the shape its reader requires."""


class StrictModel(BaseModel):
    """Exactly these keys, exactly these types, finite numbers; read-only once validated."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            shown = key if len(key) <= 100 else key[:100] + "..."
            raise _DuplicateKey(
                f"not valid JSON (the key {shown!r} appears twice in one object; refusing a document "
                "that two readers could read differently)"
            )
        seen.add(key)


def _ignore(_: str) -> None:
    return None


# keys only: numbers are not built (no 4,300-digit limit, no cost); depth is bounded by the first parse
_KEYS_ONLY = json.JSONDecoder(object_pairs_hook=_unique_pairs, parse_int=_ignore, parse_float=_ignore)


def refuse_duplicate_keys(data: bytes | str) -> None:
    """``ValueError`` when an object of ``data`` (already known to be JSON) holds a key twice."""
    if (b"{" if isinstance(data, bytes) else "{") not in data:
        return
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data
    try:
        _KEYS_ONLY.decode(text.lstrip("\ufeff \t\n\r"))
    except _DuplicateKey:
        raise
    except (ValueError, RecursionError) as exc:  # what the first parse accepted and this one does not
        raise ValueError(f"not valid JSON ({type(exc).__name__})") from None


def parse(data: bytes | str) -> Any:
    """JSON bytes → Python objects; ``ValueError`` naming the first defect for anything that is not JSON (or holds
    a key twice in one object)."""
    try:
        doc = pydantic_core.from_json(data, allow_inf_nan=False)
    except ValueError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    refuse_duplicate_keys(data)
    return doc


def describe(exc: ValidationError) -> str:
    """One line for a validation error: where the first problem is, what it is, how many more there are."""
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "the document"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def validate_json(model: type[M], data: bytes) -> M:
    """JSON bytes parsed and checked against ``model`` in one pass (no intermediate Python objects: about twice as
    fast as ``parse`` + ``validate`` on large documents). ``ValueError`` "not valid JSON (...)" for bytes that are
    not JSON, ``SchemaError`` naming the first mismatch otherwise."""
    try:
        found = model.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        if first["type"] == "json_invalid":
            raise ValueError(f"not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})") from None
        raise SchemaError(describe(exc)) from None
    refuse_duplicate_keys(data)
    return found


def validate(model: type[M], obj: Any) -> M:
    """``obj`` checked against ``model`` (strict); ``SchemaError`` naming the first mismatch otherwise."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise SchemaError(describe(exc)) from None
