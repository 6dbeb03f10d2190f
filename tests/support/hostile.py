"""Hostile payloads for the tests that prove a file never reaches code that would run it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class ShellPayload:
    """Unpickling this runs ``touch <marker>`` through ``os.system`` (a restricted unpickler names it
    ``posix.system``): if ``marker`` exists afterwards, the pickle was run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))
