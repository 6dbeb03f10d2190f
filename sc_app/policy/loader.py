"""PromptLoader: hands out prompt indices in order, remembers which are taken but not yet committed.

State (``train_dataloader.pt``): ``next_index`` and ``reissue`` — prompts taken but not committed when the
place was noted. Invariant on resume (``load_state_dict(state, skip=...)``): every index below the largest one
ever handed out is either in the restored replay index (``skip``), was consumed before the bundle, or is handed
out again — nothing silently skipped, nothing committed twice.
"""

from __future__ import annotations

from collections import deque
from typing import Any

LOADER_SCHEMA_VERSION = 1


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
        if state.get("schema_version") != LOADER_SCHEMA_VERSION:
            raise ValueError(f"loader state schema_version {state.get('schema_version')!r} unsupported")
        self.next_index = int(state["next_index"])
        self._skip = {i for i in skip if i >= self.next_index}
        self._reissue = deque(i for i in state["reissue"] if i not in skip)
        self._pending = set()
