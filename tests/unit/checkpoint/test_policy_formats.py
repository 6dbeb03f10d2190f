"""The policy directory's check is chosen by the policy format the manifest records (absent: the tiny model's)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from sc_app.checkpoint import policy_formats, verify_bundle
from sc_app.checkpoint.policy_formats import PolicyCheck
from tests.support.bundles import make_bundle, reseal


def test_the_default_format_is_checked_when_the_manifest_records_none(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    assert verify_bundle(bundle).manifest.policy_format is None  # type: ignore[union-attr]
    (bundle / "policy" / "extra.bin").write_bytes(b"x")
    reseal(bundle)
    report = verify_bundle(bundle)
    assert any("extra.bin: not a file of policy format sc-app/torch-v1" in p for p in report.problems)


def test_an_unknown_format_is_a_problem_naming_it(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    reseal(bundle, lambda d: d.update(policy_format="someone/else-v9"))
    report = verify_bundle(bundle)
    assert any("policy format 'someone/else-v9' is not one this sc-app reads" in p for p in report.problems)


def test_a_registered_format_gets_its_own_checker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[PolicyCheck] = []

    def check(ctx: PolicyCheck) -> list[str]:
        seen.append(ctx)
        data = ctx.files.read("policy/model.pt", 1 << 30)  # hash-checked bytes, through the bundle's files
        return [] if data else [f"{ctx.files.at('policy/model.pt')}: empty"]

    def broken(ctx: PolicyCheck) -> list[str]:
        raise RuntimeError("checker bug")

    module = types.ModuleType("fake_policy_format")
    module.check = check  # type: ignore[attr-defined]
    module.broken = broken  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_policy_format", module)
    monkeypatch.setitem(policy_formats.CHECKERS, "fake/v1", "fake_policy_format:check")
    monkeypatch.setitem(policy_formats.CHECKERS, "fake/broken", "fake_policy_format:broken")
    bundle = make_bundle(tmp_path, 2)
    reseal(bundle, lambda d: d.update(policy_format="fake/v1"))
    assert verify_bundle(bundle).ok and len(seen) == 1 and seen[0].policy_dir == "policy"
    reseal(bundle, lambda d: d.update(policy_format="fake/broken"))
    report = verify_bundle(bundle)
    assert any("the fake/broken checker failed (RuntimeError: checker bug)" in p for p in report.problems)
