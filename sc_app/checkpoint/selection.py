"""Which bundle of a checkpoint directory may be used: decided here, for every command that uses one.

``sc-app run`` (``job.run_job``), ``sc-app preflight``, ``sc-app export`` and ``sc-app ckpt list|verify|prune`` judge
a directory's bundles through one ``BundleRules`` and choose the one to use with ``choose_bundle``. The rules:

* a bundle must verify (``verify_bundle``) with the HMAC key of this process (``SC_APP_CHECKPOINT_HMAC_KEY``);
* it must belong to the directory's lineage (``LINEAGE``): a bundle copied in from another job is never resumed,
  exported, counted by retention or taken as its anchor, however high its step;
* for a run, it must have been written by a compatible config (``compat``) — a newest verified bundle that was
  not refuses the run (one line, nothing moved: no older bundle is resumed in its place) —, and — unless
  ``task.allow_changed_dataset`` — with the same dataset file the task reads now;
* the newest bundle that passes is chosen (``on_corrupt``: ``fallback`` skips bad newer ones, ``strict`` refuses),
  or the one a command names (``step``); ``resume.plan_resume`` owns the walk over the bundles and the tidying.

Every refusal is a ``ResumePlan`` with ``decision == "refuse"`` made here or in ``plan_resume``, never by a caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sc_app.checkpoint import layout
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.dataset import DatasetRecord, DatasetUnusable, changed_dataset_problem
from sc_app.checkpoint.hmac_keys import HmacKey
from sc_app.checkpoint.lineage import read_lineage
from sc_app.checkpoint.manifest import hmac_key_from_env
from sc_app.checkpoint.resume import ResumePlan, incompatible_line, plan_resume
from sc_app.checkpoint.retention import prune
from sc_app.checkpoint.verify import BundleReport, verify_bundle

if TYPE_CHECKING:
    from sc_app.config.app import AppConfig

OnCorrupt = Literal["fallback", "strict"]
# The task's dataset file as it is now (None: the task has none); raises DatasetUnusable when it cannot be read.
DatasetProbe = Callable[[], DatasetRecord | None]


@dataclass(frozen=True)
class BundleRules:
    """How the bundles of ``root`` are judged. ``lineage``: the directory's (None: it has none yet, every bundle
    belongs); ``compat``: the run's config (None: any); ``dataset``: None skips the dataset check."""

    root: Path
    lineage: str | None
    hmac_key: HmacKey | None = None
    compat: dict[str, Any] | None = None
    on_corrupt: OnCorrupt = "fallback"
    dataset: DatasetProbe | None = None

    @classmethod
    def of_dir(cls, root: str | Path, *, on_corrupt: OnCorrupt = "fallback") -> BundleRules:
        """For a command without a run config (``ckpt``, ``export``, ``preflight`` without ``--config``)."""
        root = Path(root)
        return cls(root, _lineage(root), hmac_key_from_env(), on_corrupt=on_corrupt)

    @classmethod
    def for_run(
        cls, cfg: AppConfig, *, dataset: DatasetProbe | None = None, on_corrupt: OnCorrupt | None = None
    ) -> BundleRules:
        """For a run of ``cfg`` on ``cfg.checkpoint.dir``: also its compat and, unless
        ``task.allow_changed_dataset``, the ``dataset`` check."""
        root = Path(cfg.checkpoint.dir)
        return cls(
            root,
            _lineage(root),
            hmac_key_from_env(),
            compat=compat_of(cfg),
            on_corrupt=on_corrupt or cfg.checkpoint.on_corrupt,
            dataset=None if cfg.task.allow_changed_dataset else dataset,
        )

    def with_lineage(self, lineage: str | None) -> BundleRules:
        """The same rules once the directory's lineage is known (written by the lease holder)."""
        return dataclasses.replace(self, lineage=lineage)

    def verify(self, bundle: Path, *, deep: bool = True) -> BundleReport:
        """One bundle against these rules (``deep=False``: manifest, tree and sizes only, no hashing)."""
        return verify_bundle(
            bundle, deep=deep, hmac_key=self.hmac_key, expected_compat=self.compat, expected_lineage=self.lineage
        )

    def prune(self, keep: int) -> list[str]:
        """Retention from the bundle ``choose_bundle`` would use: nothing newer, foreign or unverified goes."""
        plan = choose_bundle(dataclasses.replace(self, on_corrupt="fallback", dataset=None))
        anchor = plan.bundle if plan.decision == "resume" else None
        return prune(self.root, keep, hmac_key=self.hmac_key, newest_verified=anchor, expected_lineage=self.lineage)


def _lineage(root: Path) -> str | None:
    return read_lineage(root) if root.is_dir() else None


def choose_bundle(
    rules: BundleRules,
    *,
    tidy: bool = False,
    unrestorable: Mapping[str, str] | None = None,
    step: int | None = None,
) -> ResumePlan:
    """The bundle of ``rules.root`` to use and whether it may be: the newest that passes ``rules`` (or the one
    named by ``step``), ``fresh`` when there is none, ``refuse`` with the reason otherwise. ``tidy``: move leftovers
    and bad bundles to quarantine (only the lease holder, or a command that found no live lease, may).
    ``unrestorable``: bundle name → why it verified but could not be restored (treated as failing verification)."""
    if step is not None:
        plan = _named(rules, step)
    else:
        plan = plan_resume(
            rules.root,
            on_corrupt=rules.on_corrupt,
            hmac_key=rules.hmac_key,
            expected_compat=rules.compat,
            tidy=tidy,
            unrestorable=unrestorable,
            expected_lineage=rules.lineage,
        )
    problem = _dataset_problem(rules, plan)
    return dataclasses.replace(plan, decision="refuse", reason=problem) if problem else plan


def _named(rules: BundleRules, step: int) -> ResumePlan:
    bundle = rules.root / layout.step_name(step)
    if not bundle.is_dir():
        return ResumePlan(
            "refuse",
            f"no {bundle.name} in {rules.root}; `sc-app ckpt list --checkpoint-dir {rules.root}` shows the bundles",
            step=step,
        )
    report = rules.verify(bundle)
    if not report.verified:
        return ResumePlan("refuse", f"{bundle} does not verify ({report.problems[0]})", step=step, reports=[report])
    if report.incompatible:
        return ResumePlan("refuse", incompatible_line(report), step=step, reports=[report])
    return ResumePlan("resume", "the bundle asked for, verified", bundle=bundle, step=report.step, reports=[report])


def _dataset_problem(rules: BundleRules, plan: ResumePlan) -> str | None:
    """Why ``plan`` must not resume with the task's dataset as it is now; None when it may."""
    if plan.decision != "resume" or rules.dataset is None:
        return None
    try:
        current = rules.dataset()
    except DatasetUnusable as exc:
        return str(exc)
    if current is None:
        return None
    recorded = plan.manifest.dataset if plan.manifest is not None else None
    return changed_dataset_problem(recorded, current, bundle=str(plan.bundle))
