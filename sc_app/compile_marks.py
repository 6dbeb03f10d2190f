"""tensordict's compiler marks, deferred until the compiler is loaded: a process start that skips ``torch._dynamo``.

Importing tensordict (every sc-app process does: the driver, each actor, TransferQueue's) calls
``torch.compiler.allow_in_graph`` / ``assume_constant_result`` on a few of its functions, and each call imports
``torch._dynamo`` — measured on the 2-core development VM, ~1.9 s of the ~4.2 CPU-seconds that importing torch and
tensordict costs, paid by every process of a job at every start, although nothing sc-app runs is compiled.

Both marks return the function they are given, unchanged; what they change is how Dynamo later treats it. So while
tensordict is being imported (only then), ``install()`` lets the two calls return the function and record it; when
``torch._dynamo`` is imported later in the process (``torch.compile``, vLLM), the recorded marks are applied right
after it loaded, before anything can be compiled. Eager behaviour is the same object either way; compiled behaviour
is the same because no compilation can happen before Dynamo is loaded. Where Dynamo is already loaded, or torch
lacks the two functions, nothing is deferred.

``import sc_app`` calls ``install()`` (an import hook only: nothing is imported until tensordict is).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

MARKS = ("allow_in_graph", "assume_constant_result")
_lock = threading.Lock()
_pending: list[tuple[str, Any]] = []  # (mark, function) recorded while tensordict was imported


class _Chained(importlib.abc.Loader):
    """``loader`` with ``before`` / ``after`` run around its ``exec_module``; the module keeps ``loader``."""

    def __init__(self, loader: Any, before: Callable[[], Any], after: Callable[[Any], None]) -> None:
        self.loader, self.before, self.after = loader, before, after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        state = self.before()
        try:
            self.loader.exec_module(module)
        finally:
            self.after(state)


class DeferCompileMarks(importlib.abc.MetaPathFinder):
    """The import hook: wraps tensordict's import (marks deferred) and Dynamo's (recorded marks applied)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "tensordict" and "torch._dynamo" not in sys.modules:
            return self._chain(fullname, path, target, _defer, _restore)
        if fullname == "torch._dynamo" and _pending:
            return self._chain(fullname, path, target, lambda: None, lambda _: apply_pending())
        return None

    def _chain(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None,
        before: Callable[[], Any],
        after: Callable[[Any], None],
    ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:  # the spec the rest of the import system finds
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Chained(spec.loader, before, after)
                return spec
        return None


def _defer() -> dict[str, Any]:
    """Swap the marks in ``torch.compiler`` for recording ones; returns the originals to put back."""
    import torch.compiler

    originals = {m: getattr(torch.compiler, m, None) for m in MARKS}
    if any(fn is None for fn in originals.values()):
        return {}

    def recording(mark: str) -> Callable[[Any], Any]:
        def record(fn: Any) -> Any:
            if "torch._dynamo" in sys.modules:  # loaded meanwhile: nothing to defer
                return originals[mark](fn)
            with _lock:
                _pending.append((mark, fn))
            return fn

        return record

    for m in MARKS:
        setattr(torch.compiler, m, recording(m))
    return originals


def _restore(originals: dict[str, Any]) -> None:
    import torch.compiler

    for m, fn in originals.items():
        setattr(torch.compiler, m, fn)


def apply_pending() -> int:
    """Apply every recorded mark (Dynamo is loaded now); returns how many."""
    import torch.compiler

    with _lock:
        todo, _pending[:] = list(_pending), []
    for mark, fn in todo:
        getattr(torch.compiler, mark)(fn)
    return len(todo)


def pending() -> list[tuple[str, Any]]:
    """The marks recorded and not yet applied."""
    with _lock:
        return list(_pending)


def install() -> None:
    """Put the import hook first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, DeferCompileMarks) for f in sys.meta_path):
        sys.meta_path.insert(0, DeferCompileMarks())
