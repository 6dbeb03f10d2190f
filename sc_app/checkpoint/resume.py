"""The walk over a directory's bundles, newest first, that finds the one to resume and tidies what may not be;
``sc_app.checkpoint.selection.choose_bundle`` (every command's decision) calls it with the directory's rules.

Invariants:
* a ``tmp_step_*`` is never resumed; with ``tidy=True`` it is moved to quarantine (never deleted);
* with ``on_corrupt="fallback"`` (``checkpoint.on_corrupt``) a bundle that fails verification is quarantined only
  when an older bundle *does* verify, so a retry can never silently start fresh over bundles it could not read;
* ``strict`` stops at the first bad newest bundle and moves nothing;
* a bundle of another lineage (``expected_lineage``) is a bad bundle like any other: never resumed;
* a ``step_N`` that is a link (or not a directory) is reported and left alone: never followed, never moved;
* a bundle that verifies but was written by an incompatible config (``expected_compat``, ``compat.py``) is no
  defect of the bundle: the walk stops there and refuses with one line naming the key, moving nothing — neither
  that bundle nor an older one is resumed in its place, so a config change can never roll training back;
* the decision is made reading only; a refusal moves nothing (no leftover either);
* if ``quarantine/`` cannot take what must be moved (not a directory, say), the plan is a refusal naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sc_app.checkpoint import layout
from sc_app.checkpoint.hmac_keys import HmacKey
from sc_app.checkpoint.manifest import Manifest
from sc_app.checkpoint.quarantine import QuarantineError, check_quarantine, move_aside
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
    hmac_key: HmacKey | None = None,
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
    hmac_key: HmacKey | None,
    expected_compat: dict[str, Any] | None,
    tidy: bool,
    unrestorable: Mapping[str, str],
    expected_lineage: str | None,
) -> ResumePlan:
    """Decide first (reading only), then — only when the decision is not a refusal — move what must go."""
    bundles = layout.step_entries(root)
    if not bundles:
        plan = ResumePlan("fresh", f"no step_N bundle in {root}: fresh start")
        return _tidy(root, plan, [], tidy)
    reports: list[BundleReport] = []
    for _, path in bundles:
        report = verify_bundle(
            path, hmac_key=hmac_key, expected_compat=expected_compat, expected_lineage=expected_lineage
        )
        if not report.verified and not os.path.lexists(path):
            continue  # pruned by the live writer while it was being checked: not a bad bundle, just gone
        if path.name in unrestorable:
            report.problems.append(f"{path}: {unrestorable[path.name]}")
        reports.append(report)
        if report.verified and report.incompatible:  # a config the user can change back: refuse, move nothing
            return ResumePlan("refuse", incompatible_line(report), reports=reports)
        if report.ok:
            break
        if on_corrupt == "strict":
            return ResumePlan(
                "refuse",
                f"newest bundle {path.name} failed verification and checkpoint.on_corrupt=strict: {report.problems[0]}",
                reports=reports,
            )
    if not reports:  # every bundle listed was pruned while being checked: a live writer moved on; look again
        again = {"on_corrupt": on_corrupt, "hmac_key": hmac_key, "expected_compat": expected_compat}
        return plan_resume(root, **again, tidy=tidy, unrestorable=unrestorable, expected_lineage=expected_lineage)
    good = reports[-1] if reports[-1].ok else None
    if good is None:
        return ResumePlan(
            "refuse",
            f"none of the {len(reports)} bundles in {root} verified (first problem: {reports[0].problems[0]}); "
            "nothing moved — inspect with `sc-app ckpt verify`, fix or move them aside, then retry",
            reports=reports,
        )
    bad = reports[:-1]
    why = f"newest complete bundle, verified ({len(good.manifest.files) if good.manifest else 0} files)"
    if bad:
        why = f"newest verified bundle; skipped {', '.join(r.name for r in bad)} ({bad[0].problems[0]})"
    plan = ResumePlan("resume", why, bundle=good.path, step=good.step, reports=reports)
    return _tidy(root, plan, bad, tidy)


def _tidy(root: Path, plan: ResumePlan, bad: list[BundleReport], tidy: bool) -> ResumePlan:
    """Move the leftover tmp dirs and the ``bad`` bundles (each failed verification) into quarantine."""
    if not tidy:
        return plan
    quarantine = root / layout.QUARANTINE_DIR
    if layout.tmp_dirs(root) or bad:
        check_quarantine(quarantine)  # a file, a link, unwritable: refused before the first move
    for tmp in layout.tmp_dirs(root):
        dest = move_aside(tmp, quarantine, "leftover tmp dir of a save that never completed; never resumable")
        plan.quarantined.append(f"{tmp.name} -> {dest.relative_to(root)}")
    for r in bad:
        if not layout.is_real_dir(r.path):  # a link or a non-directory: reported, left alone
            continue
        dest = move_aside(r.path, quarantine, "failed verification:\n" + "\n".join(r.problems))
        plan.quarantined.append(f"{r.name} -> {dest.relative_to(root)}")
    return plan


def incompatible_line(report: BundleReport) -> str:
    """One line: which config keys differ from the ones that wrote ``report``'s bundle, and what to do."""
    keys = "; ".join(p.removeprefix("incompatible: ") for p in report.incompatible)
    return (
        f"incompatible config: newest verified bundle {report.name}: {keys}; a bundle resumes only under the "
        "config that wrote it — set the key(s) back, or give the new config its own checkpoint.dir; nothing moved "
        "(bundles are quarantined only when they fail verification)"
    )
