"""Steps a killed attempt trained but never logged, read back from the bundles that cover them.

Each bundle's manifest keeps every step since the bundle before it (``steps``, ``progress.KEPT_STEP_FIELDS``). A
resumed attempt logs the steps the run log lacks: from the resumed bundle's verified manifest first, then from the
older bundles' (signature checked, files not: a log line is a report, never a resume point), newest first, until
one holds no step the log lacks. So a step a kept bundle covers is never missing from the log, whatever killed the
attempt that trained it or held its writer back. Pure apart from reading manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sc_app.checkpoint.layout import step_dirs
from sc_app.checkpoint.manifest import ManifestError, hmac_key_from_env, read_manifest
from sc_app.checkpoint.resume import ResumePlan
from sc_app.observe.records import StepMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovered:
    bundle: str  # the bundle's directory name
    steps: list[StepMetrics]


def unlogged_steps(plan: ResumePlan, logged: set[int]) -> Iterator[Recovered]:
    """The steps up to ``plan.step`` that ``logged`` lacks, per bundle, newest bundle first (module docstring)."""
    for bundle, kept in _kept_steps(plan):
        found = _missing(bundle, kept, logged, plan.step)
        if found is None:
            return
        if found.steps:
            yield found


def _kept_steps(plan: ResumePlan) -> Iterator[tuple[str, Any]]:
    """``(bundle name, its manifest's steps)``: the resumed bundle's verified manifest, then the older bundles',
    newest first, each read only when asked for (a manifest that cannot be read is passed over)."""
    manifest = plan.manifest
    if manifest is None or plan.bundle is None:
        return
    yield plan.bundle.name, manifest.doc.get("steps")
    try:
        older = [path for step, path in step_dirs(plan.bundle.parent) if step < plan.step]
    except OSError:
        return
    key = hmac_key_from_env()
    for path in older:
        try:
            kept = read_manifest(path, hmac_key=key).doc.get("steps")
        except (ManifestError, OSError) as exc:
            log.debug("run log: no steps recovered from %s (%s)", path, exc)
            continue
        yield path.name, kept


def _missing(bundle: str, kept: Any, logged: set[int], upto: int) -> Recovered | None:
    """The steps of one manifest's ``steps`` that ``logged`` lacks (added to ``logged``); None when it kept steps
    and the log lacked none of them (older bundles are not read then)."""
    if not isinstance(kept, list) or not kept:
        return Recovered(bundle, [])
    steps = []
    for doc in kept:
        rec = step_from_bundle(doc)
        if rec is not None and rec.step not in logged and rec.step <= upto:
            logged.add(rec.step)
            steps.append(rec)
    return Recovered(bundle, steps) if steps else None


def step_from_bundle(doc: Any) -> StepMetrics | None:
    """A step a bundle kept (``progress.step_summary``), or None when it is not one."""
    try:
        return StepMetrics(
            step=int(doc["step"]),
            reward_mean=float(doc["reward"]),
            reward_min=float(doc["reward_min"]),
            reward_max=float(doc["reward_max"]),
            loss=float("nan") if doc["loss"] is None else float(doc["loss"]),
            staleness=float(doc["staleness"]),
            rows_held=int(doc["rows_held"]),
            step_seconds=float(doc["step_seconds"]),
            weights_version=None if doc.get("weights_version") is None else int(doc["weights_version"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
