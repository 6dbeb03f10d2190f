"""The walk over a directory's bundles, newest first, that finds the one to resume and tidies what may not be;
``sc_app.checkpoint.selection.choose_bundle`` (every command's decision) calls it with the directory's rules.

Invariants:
* a ``tmp_step_*`` is never resumed; with ``tidy=True`` it is moved to quarantine (never deleted);
* with ``on_corrupt="fallback"`` (``checkpoint.on_corrupt``) a bundle that fails verification is quarantined only
  when an older bundle *does* verify, so a retry can never silently start fresh over bundles it could not read;
* ``strict`` stops at the first bad newest bundle and moves nothing;
* a bundle of another lineage (``expected_lineage``) is a bad bundle like any other: never resumed;
* a ``step_N`` that is a link (or not a directory) is reported and left alone: never followed, never moved;
* if ``quarantine/`` cannot take what must be moved (not a directory, say), the plan is a refusal naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sc_app.checkpoint import layout
from sc_app.checkpoint.manifest import Manifest
from sc_app.checkpoint.quarantine import QuarantineError, move_aside
from sc_app.checkpoint.verify import BundleReport, verify_bundle

Decision = Literal["resume", "fresh", "refuse"]


@dataclass
class ResumePlan:
    decision: Decision
    reason: str
    bundle: Path | None = None
    step: int = 0
    reports: list[BundleReport] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.decision != "refuse"

    @property
    def manifest(self) -> Manifest | None:
        """The verified manifest of the bundle to resume (None unless ``decision == "resume"``)."""
        return self.reports[-1].manifest if self.decision == "resume" and self.reports else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reason": self.reason,
            "bundle": str(self.bundle) if self.bundle else None,
            "step": self.step,
            "checked": [r.as_dict() for r in self.reports],
            "quarantined": self.quarantined,
        }


def plan_resume(
    root: str | Path,
    *,
    on_corrupt: Literal["fallback", "strict"] = "fallback",
    hmac_key: bytes | None = None,
    expected_compat: dict[str, Any] | None = None,
    tidy: bool = True,
    unrestorable: Mapping[str, str] | None = None,
    expected_lineage: str | None = None,
) -> ResumePlan:
    """``tidy``: move leftovers and bad bundles to quarantine (only the lease holder, or a command that found no
    live lease, may). ``unrestorable``: bundle name → why it verified but could not be restored; such a bundle is
    treated as one that failed verification (fallback moves it aside only when an older bundle verifies).
    ``expected_lineage``: the directory's lineage; a bundle recording another one is never resumed."""
    root = Path(root)
    try:
        return _plan(root, on_corrupt, hmac_key, expected_compat, tidy, unrestorable or {}, expected_lineage)
    except QuarantineError as exc:
        return ResumePlan("refuse", f"cannot move a bad bundle or leftover aside: {exc}")
    except OSError as exc:
        return ResumePlan("refuse", f"cannot use checkpoint dir {root}: {exc}")


def _plan(
    root: Path,
    on_corrupt: Literal["fallback", "strict"],
    hmac_key: bytes | None,
    expected_compat: dict[str, Any] | None,
    tidy: bool,
    unrestorable: Mapping[str, str],
    expected_lineage: str | None,
) -> ResumePlan:
    quarantine = root / layout.QUARANTINE_DIR
    moved: list[str] = []
    if tidy:
        for tmp in layout.tmp_dirs(root):
            dest = move_aside(tmp, quarantine, "leftover tmp dir of a save that never completed; never resumable")
            moved.append(f"{tmp.name} -> {dest.relative_to(root)}")
    bundles = layout.step_entries(root)
    if not bundles:
        return ResumePlan("fresh", f"no step_N bundle in {root}: fresh start", quarantined=moved)
    reports: list[BundleReport] = []
    for _, path in bundles:
        report = verify_bundle(
            path, hmac_key=hmac_key, expected_compat=expected_compat, expected_lineage=expected_lineage
        )
        if not report.ok and not os.path.lexists(path):
            continue  # pruned by the live writer while it was being checked: not a bad bundle, just gone
        if path.name in unrestorable:
            report.problems.append(f"{path}: {unrestorable[path.name]}")
        reports.append(report)
        if report.ok:
            break
        if on_corrupt == "strict":
            return ResumePlan(
                "refuse",
                f"newest bundle {path.name} failed verification and checkpoint.on_corrupt=strict: {report.problems[0]}",
                reports=reports,
                quarantined=moved,
            )
    if not reports:  # every bundle listed was pruned while being checked: a live writer moved on; look again
        again = {"on_corrupt": on_corrupt, "hmac_key": hmac_key, "expected_compat": expected_compat}
        return plan_resume(root, **again, tidy=False, unrestorable=unrestorable, expected_lineage=expected_lineage)
    good = reports[-1] if reports[-1].ok else None
    if good is None:
        return ResumePlan(
            "refuse",
            f"none of the {len(reports)} bundles in {root} verified (first problem: {reports[0].problems[0]}); "
            "nothing moved — inspect with `sc-app ckpt verify`, fix or move them aside, then retry",
            reports=reports,
            quarantined=moved,
        )
    bad = reports[:-1]
    if tidy:
        for r in bad:
            if not layout.is_real_dir(r.path):  # a link or a non-directory: reported, left alone
                continue
            dest = move_aside(r.path, quarantine, "failed verification:\n" + "\n".join(r.problems))
            moved.append(f"{r.name} -> {dest.relative_to(root)}")
    why = f"newest complete bundle, verified ({len(good.manifest.files) if good.manifest else 0} files)"
    if bad:
        why = f"newest verified bundle; skipped {', '.join(r.name for r in bad)} ({bad[0].problems[0]})"
    return ResumePlan("resume", why, bundle=good.path, step=good.step, reports=reports, quarantined=moved)
