"""Reward functions of the ``jsonl`` task: built-ins and the user's ``package.module:function``.

A reward function is called with keywords — ``fn(prompt=str, completion=str, answer=str)`` — and returns a
finite number (typically 0..1). ``resolve_reward`` turns ``task.reward`` into a ``RewardFn`` and refuses, in one
line (``RewardError``), a spec it cannot import or call; ``score`` refuses a non-numeric or non-finite result.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from sc_app.rl.hf.errors import HFInputError

BUILTIN = ("exact_match", "numeric_match")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


class RewardError(HFInputError):
    """``task.reward`` cannot be used, or returned something that is not a finite number; one line."""


def _normalise(text: str) -> str:
    return " ".join(text.split())


def exact_match(*, prompt: str, completion: str, answer: str) -> float:
    """1.0 when the completion equals the answer up to surrounding and repeated whitespace, else 0.0."""
    return 1.0 if _normalise(completion) == _normalise(answer) else 0.0


def _number(text: str) -> float | None:
    """The last number written in ``text`` (digits may be space-separated: "4 2" is 42)."""
    compact = re.sub(r"(?<=\d)\s+(?=[\d.])", "", text)
    found = _NUMBER.findall(compact)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_match(*, prompt: str, completion: str, answer: str) -> float:
    """1.0 when the last number in the completion equals the answer's number (relative tolerance 1e-6)."""
    want, got = _number(answer), _number(completion)
    if want is None or got is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9) else 0.0


RewardCallable = Callable[..., float]


@dataclass(frozen=True)
class RewardFn:
    spec: str
    fn: RewardCallable

    def __call__(self, *, prompt: str, completion: str, answer: str) -> float:
        return score(self, prompt=prompt, completion=completion, answer=answer)


def resolve_reward(spec: str) -> RewardFn:
    """``exact_match`` | ``numeric_match`` | ``package.module:function`` → a checked ``RewardFn``."""
    if spec in BUILTIN:
        return RewardFn(spec, {"exact_match": exact_match, "numeric_match": numeric_match}[spec])
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or not all(p.isidentifier() for p in (*module_name.split("."), attr)):
        raise RewardError(f"task.reward {spec!r}: expected {' or '.join(BUILTIN)} or package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(
            f"task.reward {spec!r}: cannot import {module_name} ({exc.__class__.__name__}: {exc}); install it or "
            "put it on PYTHONPATH of every worker"
        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise RewardError(f"task.reward {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(fn):
        raise RewardError(f"task.reward {spec!r}: {attr} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(prompt="", completion="", answer="")
    except TypeError:
        raise RewardError(
            f"task.reward {spec!r}: must accept keywords prompt, completion, answer (e.g. def {attr}(*, prompt, "
            "completion, answer) -> float)"
        ) from None
    except ValueError:
        pass  # no signature to inspect (a builtin): the first call decides
    return RewardFn(spec, fn)


def score(reward: RewardFn, *, prompt: str, completion: str, answer: str) -> float:
    value = reward.fn(prompt=prompt, completion=completion, answer=answer)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy and torch scalars
        except (TypeError, ValueError):
            raise RewardError(f"task.reward {reward.spec!r} returned {type(value).__name__}, not a number") from None
    value = float(value)
    if not math.isfinite(value):
        raise RewardError(f"task.reward {reward.spec!r} returned {value}, not a finite number")
    return value
