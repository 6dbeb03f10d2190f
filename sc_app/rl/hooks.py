"""What a model backend or a task adds to the generic path (``attempt``, ``cli``): named here, imported on use.

The generic path never imports a backend's package. It asks this module instead:

* ``check_inputs(cfg)``: the backend's checks before Ray starts (model directory, dataset, reward; an
  ``InputError``, one line, exit 2) and the dataset record every bundle carries;
* ``current_dataset(cfg)``: the task's dataset file as it is now, for ``sc-app preflight`` (no model checks);
* ``export_policy(backend, ...)``: a bundle's policy in the backend's own loadable layout (``sc-app export``).

Adding a backend or a task: write these functions next to its code and add one line to the table they belong in
(name → ``"module:function"``, imported only when a run of that backend or task needs it, so this module stays
light), as ``sc_app.checkpoint.policy_formats`` does for policy checkers. A backend or task without an entry has
nothing to check, no dataset, or nothing to export.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sc_app.checkpoint.dataset import DatasetRecord, DatasetUnusable

if TYPE_CHECKING:
    from sc_app.config.app import AppConfig

# model.backend → check(cfg) -> DatasetRecord | None, raising an InputError
INPUT_CHECKS: dict[str, str] = {"hf": "sc_app.rl.hf.inputs:checked_dataset"}
# task.name → record(cfg) -> DatasetRecord, raising an InputError
TASK_DATASETS: dict[str, str] = {"jsonl": "sc_app.rl.hf.inputs:dataset_now"}
# model.backend → export(policy_dir, expected, out) -> Exported, raising an ExportFailed
EXPORTERS: dict[str, str] = {"hf": "sc_app.rl.hf.export:export_for_cli"}


class InputError(ValueError):
    """A model directory, dataset or reward function that cannot be used; ``str()`` is one line. Raised by a
    backend's checks on the driver and by its workers (the driver re-raises it as itself): exit 2."""


class RewardFailed(RuntimeError):
    """The reward function failed while the job ran (raised, exited, returned a non-finite or non-numeric value):
    ``str()`` is one line naming the function. Not bad input found before the run — the job failed (exit 1) — and
    typed, so the name survives the worker → controller → driver path instead of a generic "rollout pump failed".
    Defined here, not in a backend, so the generic path (controller, exits) names it without importing one."""


def typed_failure(exc: BaseException) -> RewardFailed | InputError | None:
    """The one-line error (``RewardFailed``, ``InputError``) a worker raised, out of Ray's ``RayTaskError`` wrapper
    (``exc`` itself when not wrapped); None for any other error (a defect: its traceback is shown)."""
    cause = getattr(exc, "cause", None)
    found = cause if isinstance(cause, BaseException) else exc
    return found if isinstance(found, RewardFailed | InputError) else None


class ExportFailed(ValueError):
    """The export cannot be written or the bundle's policy does not read back; ``str()`` is one line."""


class Exported(Protocol):
    """What an exporter wrote."""

    out: Path
    files: tuple[str, ...]
    dtype: str
    parameters: int
    load_with: str  # what loads it, e.g. AutoModelForCausalLM.from_pretrained


def _resolve(table: Mapping[str, str], name: str) -> Callable[..., Any] | None:
    target = table.get(name)
    if target is None:
        return None
    module, _, func = target.partition(":")
    fn: Callable[..., Any] = getattr(importlib.import_module(module), func)
    return fn


def check_inputs(cfg: AppConfig) -> DatasetRecord | None:
    """The backend's input checks before anything is taken or started; the dataset record bundles carry."""
    check = _resolve(INPUT_CHECKS, cfg.model.backend)
    return check(cfg) if check is not None else None


def current_dataset(cfg: AppConfig) -> DatasetRecord | None:
    """The task's dataset file now (None for a task without one); ``DatasetUnusable`` when it cannot be read."""
    record = _resolve(TASK_DATASETS, cfg.task.name)
    if record is None:
        return None
    try:
        found: DatasetRecord = record(cfg)
    except InputError as exc:
        raise DatasetUnusable(str(exc)) from None
    return found


def can_export(backend: str) -> bool:
    return backend in EXPORTERS


def export_policy(backend: str, policy_dir: Path, expected: Mapping[str, str], out: str | Path) -> Exported:
    """Pre: ``can_export(backend)``; ``expected`` (policy-dir-relative name → digest) from a verified manifest."""
    export = _resolve(EXPORTERS, backend)
    assert export is not None, backend
    result: Exported = export(policy_dir, expected, out)
    return result
