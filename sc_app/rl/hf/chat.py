"""Prompt text → token ids (through the tokenizer's chat template when it has one) and left padding.

Prompts are left-padded to a fixed length so every row of a step has the same shape in the data plane; the
attention mask marks the padding, and positions are counted from the first real token (``logprobs.position_ids``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch


def pad_id(tokenizer: Any) -> int:
    """The id used for padding: the tokenizer's pad token, else its eos token."""
    pid = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pid is None:
        raise ValueError("the tokenizer has neither a pad nor an eos token")
    return int(pid)


class PromptError(ValueError):
    """A prompt the tokenizer or its chat template cannot turn into ids; ``str()`` says why in a few words."""


def max_prompt_chars(tokenizer: Any, prompt_len: int) -> int:
    """More characters than any text of ``prompt_len`` tokens can have: ``prompt_len`` times the longest token of the
    vocabulary (at least 16 characters each). Longer text is refused before the tokenizer sees it."""
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=16)
    except Exception:  # a tokenizer without a vocabulary listing: a generous fixed bound
        longest = 64
    return prompt_len * max(16, longest) + 1024


def encode_prompt(tokenizer: Any, text: str, max_chars: int | None = None) -> list[int]:
    """One user message → ids ready for generation (chat template with the generation prompt when there is one).

    ``PromptError`` for text (or a rendered template) longer than ``max_chars``, a template that fails, raises or
    runs longer than ``TEMPLATE_SECONDS`` (in the main thread), and text the tokenizer refuses (lone surrogates)."""
    limit = max_chars if max_chars is not None else len(text) + (1 << 20)
    if len(text) > limit:
        raise PromptError(f"{len(text):,} characters, more than {limit:,} ({_BOUND})")
    templated = bool(getattr(tokenizer, "chat_template", None))
    if templated:
        try:
            with time_limit(TEMPLATE_SECONDS):
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
                )
        except TemplateTimeout:
            raise PromptError(f"the chat template ran longer than {TEMPLATE_SECONDS:g} s; fix the template") from None
        except Exception as exc:  # jinja2's errors, a template's raise_exception(), anything it calls
            raise PromptError(f"the chat template failed ({_first(exc)}); fix the template or the prompt") from None
        if not isinstance(text, str) or len(text) > limit:
            raise PromptError(f"the chat template rendered more than {limit:,} characters ({_BOUND})")
    try:
        return list(tokenizer(text, add_special_tokens=not templated)["input_ids"])
    except Exception as exc:  # the Rust tokenizer's errors (e.g. a lone surrogate), any tokenizer's
        raise PromptError(f"the tokenizer refused it ({_first(exc)})") from None


_BOUND = "prompt_len x the longest token: it cannot fit task.prompt_len"
TEMPLATE_SECONDS = 10.0


class TemplateTimeout(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise ``TemplateTimeout`` in the body after ``seconds`` (main thread only: elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(_signum: int, _frame: Any) -> None:
        raise TemplateTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def left_pad(sequences: list[list[int]], length: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, length]`` ids and attention mask; pre: every sequence has 1..length ids."""
    ids = torch.full((len(sequences), length), pad, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if not 0 < len(seq) <= length:
            raise ValueError(f"sequence {i} has {len(seq)} ids, expected 1..{length}")
        ids[i, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, length - len(seq) :] = 1
    return ids, mask
