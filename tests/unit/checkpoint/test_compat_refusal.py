"""Issue 31 D: a config change never rolls training back. For every compat key (``compat.compat_of``): a directory
whose newest bundles were written under the old value and whose oldest under the new one is *refused* — one line
naming the key, exit 2 — by ``choose_bundle`` (run and preflight rules, tidy on), ``sc-app preflight`` and
``run_job``, and nothing moves: the healthy newer bundles are not quarantined, the older one is not resumed, no
leftover is tidied. ``sc-app ckpt verify`` still verifies every bundle afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import layout
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.selection import BundleRules, choose_bundle
from sc_app.cli import main
from sc_app.config.app import load_config
from tests.support.bundles import make_bundle, make_tmp_leftover, reseal, tree

TINY = [  # the config tests.support.bundles writes its bundles with
    "model.vocab_size=10",
    "model.d_model=8",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.max_seq_len=8",
    "task.prompt_len=2",
    "task.response_len=2",
    "grpo.group_size=2",
]
HF = ["model.backend=hf", "model.path=/models/m"]
JSONL = [*HF, "task.name=jsonl", "task.path=/data/d.jsonl"]

# compat key → (the config the newer bundles were written with, the config of the run that must be refused)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "run.seed": (TINY, [*TINY, "run.seed=7"]),
    "data_plane.partition": (TINY, [*TINY, "data_plane.partition=other"]),
    "data_plane.storage_units": (TINY, [*TINY, "data_plane.storage_units=2"]),  # native bundles: cannot re-route
    "grpo.group_size": (TINY, [*TINY, "grpo.group_size=4"]),
    "task.prompt_len": (TINY, [*TINY, "task.prompt_len=3"]),
    "task.response_len": (TINY, [*TINY, "task.response_len=3"]),
    "model.vocab_size": (TINY, [*TINY, "model.vocab_size=12"]),
    "model.d_model": (TINY, [*TINY, "model.d_model=16"]),
    "model.n_layers": (TINY, [*TINY, "model.n_layers=2"]),
    "model.n_heads": (TINY, [*TINY, "model.n_heads=4"]),
    "model.max_seq_len": (TINY, [*TINY, "model.max_seq_len=16"]),
    "model.backend": (TINY, HF),
    "task.name": (JSONL, HF),
    "task.shuffle": (JSONL, [*JSONL, "task.shuffle=false"]),
}


def test_the_cases_cover_every_compat_key() -> None:
    """A key added to ``compat_of`` must be added here (and so be refused, not quarantined, when it changes)."""
    seen: set[str] = set()
    for old, _ in CASES.values():
        seen |= set(compat_of(load_config(None, old)))
    assert seen == set(CASES)


def _compat(overrides: list[str]) -> dict[str, Any]:
    return compat_of(load_config(None, overrides))


def _bundle(root: Path, step: int, compat: dict[str, Any], native: bool) -> None:
    """A real bundle (a tiny policy) recording ``compat``; an hf config's compat gets the tiny ``model.*`` keys the
    policy files were written with too (they let the contents check load them; no hf config compares them)."""
    bundle = make_bundle(root, step, data_plane="native" if native else "streamed")
    shape = {k: v for k, v in _compat(TINY).items() if k.startswith("model.") and k != "model.backend"}
    reseal(bundle, lambda doc: doc.__setitem__("compat", {**shape, **compat}))


def _directory(root: Path, key: str) -> dict[str, str]:
    """step_2 written under the new config, step_4 and step_6 under the old one, a leftover tmp dir; returns the
    tree everything must keep."""
    old, new = CASES[key]
    native = key == "data_plane.storage_units"
    _bundle(root, 2, _compat(new), native)
    for step in (4, 6):
        _bundle(root, step, _compat(old), native)
    make_tmp_leftover(root, 8)
    return _bundles_tree(root)


def _bundles_tree(root: Path) -> dict[str, str]:
    return {k: v for k, v in tree(root).items() if k.split("/")[0].startswith(("step_", "tmp_step_", "quarantine"))}


@pytest.mark.parametrize("key", sorted(CASES))
def test_a_changed_compat_key_is_refused_and_moves_nothing(
    tmp_path: Path, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same directory through every command that decides on it: nothing moves at any of them."""
    before = _directory(tmp_path, key)
    old, new = CASES[key]
    cfg = load_config(None, [*new, f"checkpoint.dir={tmp_path}", "run.max_steps=20"])
    assert compat_of(cfg).get(key) != _compat(old).get(key)
    for on_corrupt in ("fallback", "strict"):  # the run's rules, as the lease holder (tidy) would apply them
        plan = choose_bundle(BundleRules.for_run(cfg, on_corrupt=on_corrupt), tidy=True)  # type: ignore[arg-type]
        assert plan.decision == "refuse", (on_corrupt, plan.reason)
        assert "incompatible" in plan.reason and key in plan.reason and "step_6" in plan.reason
        assert "\n" not in plan.reason and plan.quarantined == []
    assert _bundles_tree(tmp_path) == before, "a compat mismatch moved something"

    sets = [arg for o in new for arg in ("--set", o)]
    assert main(["preflight", "--checkpoint-dir", str(tmp_path), *sets]) == 2
    out = capsys.readouterr().out
    decision = [line for line in out.splitlines() if line.startswith("decision:")]
    assert len(decision) == 1 and "refuse" in decision[0] and key in decision[0], out
    assert not any(line.startswith("quarantined") for line in out.splitlines()) and "Traceback" not in out
    assert _bundles_tree(tmp_path) == before and not (tmp_path / layout.QUARANTINE_DIR).exists()

    if new[0] != HF[0]:  # an hf run first checks its model directory (there is none here)
        from sc_app.attempt.run import run_job
        from sc_app.attempt.setup import ResumeRefused

        with pytest.raises(ResumeRefused, match="incompatible") as refused:
            run_job(cfg)
        assert key in str(refused.value) and "\n" not in str(refused.value)
        assert _bundles_tree(tmp_path) == before and not (tmp_path / "LEASE").exists()
    # the bundles the old config wrote are healthy, as they were (step_2's policy files do not fit its model.*)
    assert main(["ckpt", "verify", "--checkpoint-dir", str(tmp_path), "step_4", "step_6"]) == 0


def test_storage_units_change_still_resumes_a_streamed_bundle(tmp_path: Path) -> None:
    """The sibling that is *not* a mismatch: a streamed data plane re-routes into any unit count."""
    for step in (2, 4):
        _bundle(tmp_path, step, _compat(TINY), native=False)
    cfg = load_config(None, [*TINY, "data_plane.storage_units=2", f"checkpoint.dir={tmp_path}"])
    plan = choose_bundle(BundleRules.for_run(cfg), tidy=True)
    assert plan.decision == "resume" and plan.step == 4 and plan.quarantined == []


def test_a_corrupt_newest_bundle_over_an_incompatible_one_is_refused_not_moved(tmp_path: Path) -> None:
    """Fallback would quarantine a corrupt newest bundle only to resume an older one; when that older one is
    incompatible the run is refused and the corrupt one stays where it is, too."""
    from tests.support.bundles import flip_byte

    _bundle(tmp_path, 2, _compat(TINY), native=False)
    _bundle(tmp_path, 4, _compat(TINY), native=False)
    flip_byte(tmp_path / "step_4" / layout.LOADER_FILE)
    before = _bundles_tree(tmp_path)
    cfg = load_config(None, [*TINY, "run.seed=9", f"checkpoint.dir={tmp_path}"])
    plan = choose_bundle(BundleRules.for_run(cfg), tidy=True)
    assert plan.decision == "refuse" and "run.seed" in plan.reason and "step_2" in plan.reason
    assert _bundles_tree(tmp_path) == before


def test_the_reported_case_native_bundles_over_an_older_streamed_one(tmp_path: Path) -> None:
    """The issue's case: more storage units over native-format bundles used to quarantine them as "incompatible"
    and resume the older streamed bundle (which re-routes): now refused, nothing moved."""
    _bundle(tmp_path, 2, _compat(TINY), native=False)
    for step in (4, 6):
        _bundle(tmp_path, step, _compat(TINY), native=True)
    before = _bundles_tree(tmp_path)
    cfg = load_config(None, [*TINY, "data_plane.storage_units=2", f"checkpoint.dir={tmp_path}"])
    plan = choose_bundle(BundleRules.for_run(cfg), tidy=True)
    assert plan.decision == "refuse" and "data_plane.storage_units is 1 in the bundle but 2" in plan.reason
    assert "step_6" in plan.reason and _bundles_tree(tmp_path) == before
