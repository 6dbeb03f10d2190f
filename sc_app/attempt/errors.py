"""The two ways a planned start is refused before or during set-up; light (no Ray, no torch), so the attempt's
planning can raise and catch them before the set-up's heavy imports are loaded."""

from __future__ import annotations

from pathlib import Path


class ResumeRefused(RuntimeError):
    """The checkpoint directory holds bundles that must not be resumed (or skipped) silently."""


class RestoreFailed(RuntimeError):
    """``bundle`` verified but could not be restored; ``str()`` is one line naming the bundle and the cause."""

    def __init__(self, bundle: Path, why: str) -> None:
        super().__init__(f"{bundle.name} verified but could not be restored: {why}")
        self.bundle = bundle
