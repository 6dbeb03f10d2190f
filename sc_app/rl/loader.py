"""PromptLoader: hands out prompt indices in order, remembers which are taken but not yet committed.

State (``train_dataloader.pt``): ``next_index`` and ``reissue`` — prompts taken but not committed when the
place was noted. Invariant on resume (``load_state_dict(state, skip=...)``): every index below the largest one
ever handed out is either in the restored replay index (``skip``), was consumed before the bundle, or is handed
out again — nothing silently skipped, nothing committed twice. ``check_loader_state`` is the whole check of that
state's shape, shared by ``load_state_dict`` and verification (``sc_app.checkpoint.contents``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

LOADER_SCHEMA_VERSION = 1
LOADER_KEYS = frozenset({"schema_version", "next_index", "reissue"})


class LoaderStateError(ValueError):
    """A loader place (``train_dataloader.pt``) that ``PromptLoader.load_state_dict`` must not take."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_loader_state(state: Any) -> dict[str, Any]:
    """``state`` if it is exactly what ``state_dict()`` writes — its keys, schema version, a non-negative
    ``next_index``, ``reissue`` a list of distinct prompt indices below it — else ``LoaderStateError``."""
    if not isinstance(state, dict):
        raise LoaderStateError(f"loader state is {type(state).__name__}, not a mapping")
    if state.get("schema_version") != LOADER_SCHEMA_VERSION or not _is_int(state.get("schema_version")):
        raise LoaderStateError(f"loader state schema_version {state.get('schema_version')!r} unsupported")
    if set(state) != LOADER_KEYS:
        raise LoaderStateError(f"loader state holds keys {sorted(map(str, state))}, expected {sorted(LOADER_KEYS)}")
    nxt, reissue = state["next_index"], state["reissue"]
    if not _is_int(nxt) or nxt < 0:
        raise LoaderStateError(f"loader next_index {nxt!r} is not a non-negative integer")
    if not isinstance(reissue, list) or not all(_is_int(i) and 0 <= i < nxt for i in reissue):
        raise LoaderStateError(f"loader reissue must be a list of prompt indices below next_index {nxt}")
    if len(set(reissue)) != len(reissue):
        raise LoaderStateError("loader reissue lists a prompt twice")
    return state


class PromptLoader:
    def __init__(self) -> None:
        self.next_index = 0
        self._reissue: deque[int] = deque()
        self._skip: set[int] = set()
        self._pending: set[int] = set()

    def take(self) -> int:
        while self._reissue:
            idx = self._reissue.popleft()
            if idx not in self._skip:
                self._pending.add(idx)
                return idx
        while self.next_index in self._skip:
            self._skip.discard(self.next_index)
            self.next_index += 1
        idx = self.next_index
        self.next_index += 1
        self._pending.add(idx)
        return idx

    def settled(self, idx: int) -> None:
        """The prompt's group was committed (or deliberately discarded): never re-issue it."""
        self._pending.discard(idx)

    @property
    def pending(self) -> set[int]:
        return set(self._pending)

    def state_dict(self) -> dict[str, Any]:
        reissue = sorted(self._pending | set(self._reissue))
        return {"schema_version": LOADER_SCHEMA_VERSION, "next_index": self.next_index, "reissue": reissue}

    def load_state_dict(self, state: dict[str, Any], *, skip: set[int]) -> None:
        check_loader_state(state)
        self.next_index = int(state["next_index"])
        self._skip = {i for i in skip if i >= self.next_index}
        self._reissue = deque(i for i in state["reissue"] if i not in skip)
        self._pending = set()
