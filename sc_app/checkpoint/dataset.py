"""What a bundle records about its task's dataset file, and when a resume must refuse a changed one. Pure.

A task that reads a dataset file (the hf backend's ``jsonl``) hands the generic path a ``DatasetRecord``: the file's
path, the sha256 of its exact bytes and its row count. Every bundle records it (``manifest.json`` ``dataset``), and
``sc_app.checkpoint.selection`` refuses to resume a bundle cut with other bytes unless
``task.allow_changed_dataset`` (the loader place would point into another file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class DatasetUnusable(ValueError):
    """The task's dataset file cannot be read to compare it with a bundle's; ``str()`` is one line."""


class DatasetFile(Sized, Protocol):
    """What a task's loaded dataset exposes to be recorded."""

    @property
    def path(self) -> Path: ...

    @property
    def sha256(self) -> str: ...


@dataclass(frozen=True)
class DatasetRecord:
    """What a bundle records about the dataset its loader place points into (``manifest.json`` ``dataset``)."""

    path: str
    sha256: str
    rows: int

    def as_manifest(self) -> dict[str, str | int]:
        return {"path": self.path, "sha256": self.sha256, "rows": self.rows}

    @classmethod
    def of(cls, dataset: DatasetFile) -> DatasetRecord:
        return cls(str(dataset.path), dataset.sha256, len(dataset))


def changed_dataset_problem(recorded: Mapping[str, Any] | None, current: DatasetRecord, *, bundle: str) -> str | None:
    """One line when ``current`` is not the file ``bundle`` was cut with; None when it is."""
    then = recorded.get("sha256") if isinstance(recorded, Mapping) else None
    if then == current.sha256:
        return None
    was = f"sha256 {str(then)[:12]}... then" if then else "no dataset hash recorded"
    return (
        f"task.path {current.path} is not the file {bundle} was cut with ({was}, {current.sha256[:12]}... now): "
        "restore that file, or set task.allow_changed_dataset=true to resume with this one (the loader place then "
        "points into the new file)"
    )
