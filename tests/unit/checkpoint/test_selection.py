"""checkpoint.selection: the one decision "which bundle, and may it be used" — the directory's lineage, the run's
compat and dataset, the newest verified or a named bundle — and retention anchored on that same decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint.dataset import DatasetRecord, DatasetUnusable
from sc_app.checkpoint.lineage import ensure_lineage
from sc_app.checkpoint.selection import BundleRules, choose_bundle
from sc_app.config.app import AppConfig
from tests.support.bundles import CFG, COMPAT, make_bundle, reseal, tree

OURS, THEIRS = "lin-ours", "lin-theirs"
RECORD = DatasetRecord("/data/train.jsonl", "a" * 64, 10)


def own_dir(root: Path) -> BundleRules:
    ensure_lineage(root, adopt=OURS)
    return BundleRules.of_dir(root)


def test_the_directory_rules_read_its_lineage(tmp_path: Path) -> None:
    assert BundleRules.of_dir(tmp_path / "absent").lineage is None
    assert own_dir(tmp_path).lineage == OURS
    assert BundleRules.of_dir(tmp_path).with_lineage("x").lineage == "x"


def test_the_newest_bundle_of_another_lineage_is_skipped_never_chosen(tmp_path: Path) -> None:
    make_bundle(tmp_path, 4, lineage=OURS)
    make_bundle(tmp_path, 90, lineage=THEIRS)
    plan = choose_bundle(own_dir(tmp_path))
    assert plan.decision == "resume" and plan.step == 4
    assert "belongs to lineage" in plan.reports[0].problems[0] and plan.quarantined == [], "tidy=False moves nothing"


def test_only_foreign_bundles_is_a_refusal(tmp_path: Path) -> None:
    make_bundle(tmp_path, 90, lineage=THEIRS)
    plan = choose_bundle(own_dir(tmp_path))
    assert plan.decision == "refuse" and "belongs to lineage" in plan.reason


@pytest.mark.parametrize(("step", "decision", "needle"), [(4, "resume", ""), (90, "refuse", "belongs to lineage")])
def test_a_named_bundle_must_pass_the_same_rules(tmp_path: Path, step: int, decision: str, needle: str) -> None:
    make_bundle(tmp_path, 4, lineage=OURS)
    make_bundle(tmp_path, 90, lineage=THEIRS)
    plan = choose_bundle(own_dir(tmp_path), step=step)
    assert plan.decision == decision and needle in plan.reason
    assert choose_bundle(own_dir(tmp_path), step=7).reason.startswith(f"no step_7 in {tmp_path}")


def with_dataset(bundle: Path, sha256: str) -> None:
    reseal(bundle, lambda doc: doc.update(dataset={"path": RECORD.path, "sha256": sha256, "rows": 10}))


def run_rules(root: Path, probe: object, *, allow_changed: bool = False) -> BundleRules:
    cfg = CFG.model_copy(update={"task": CFG.task.model_copy(update={"allow_changed_dataset": allow_changed})})
    cfg = AppConfig.model_validate({**cfg.model_dump(), "checkpoint": {"dir": str(root)}})
    return BundleRules.for_run(cfg, dataset=probe)  # type: ignore[arg-type]


def test_a_run_resumes_only_the_dataset_its_bundle_was_cut_with(tmp_path: Path) -> None:
    with_dataset(make_bundle(tmp_path, 2), RECORD.sha256)
    assert run_rules(tmp_path, lambda: RECORD).compat == COMPAT
    assert choose_bundle(run_rules(tmp_path, lambda: RECORD)).decision == "resume"
    changed = DatasetRecord(RECORD.path, "b" * 64, 11)
    refused = choose_bundle(run_rules(tmp_path, lambda: changed))
    assert refused.decision == "refuse" and "task.allow_changed_dataset=true" in refused.reason
    assert refused.bundle == tmp_path / "step_2", "the refusal names the bundle it would have resumed"
    assert choose_bundle(run_rules(tmp_path, lambda: changed, allow_changed=True)).decision == "resume"
    assert choose_bundle(run_rules(tmp_path, lambda: None)).decision == "resume", "a task without a dataset file"


def test_an_unreadable_dataset_is_the_refusal_reason(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)

    def unreadable() -> DatasetRecord:
        raise DatasetUnusable("task.path /x: no such file; point task.path at a JSONL file")

    plan = choose_bundle(run_rules(tmp_path, unreadable))
    assert plan.decision == "refuse" and plan.reason.startswith("task.path /x: no such file")


def test_a_fresh_start_never_reads_the_dataset(tmp_path: Path) -> None:
    def never() -> DatasetRecord:
        raise AssertionError("no bundle to compare with")

    assert choose_bundle(run_rules(tmp_path, never)).decision == "fresh"


def test_prune_is_anchored_on_the_chosen_bundle_and_leaves_foreign_ones(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        make_bundle(tmp_path, step, lineage=OURS)
    foreign = tree(make_bundle(tmp_path, 100, lineage=THEIRS))
    assert sorted(own_dir(tmp_path).prune(1)) == ["step_2", "step_4"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_100", "step_6"]
    assert tree(tmp_path / "step_100") == foreign

