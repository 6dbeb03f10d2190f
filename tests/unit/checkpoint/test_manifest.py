"""checkpoint.manifest: schema version, HMAC signatures, and manifests of the wrong shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import plan_resume, verify_bundle
from sc_app.checkpoint.manifest import HMAC_ENV, ManifestError, hmac_key_from_env, read_manifest
from tests.support.bundles import COMPAT, edit_manifest, make_bundle


def test_manifest_schema_version_is_checked(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["schema_version"] = 999
    (bundle / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="schema_version"):
        read_manifest(bundle)


def test_hmac_signed_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = b"s3cret"
    signed = make_bundle(tmp_path, 2, hmac_key=key)
    unsigned = make_bundle(tmp_path, 4)
    assert verify_bundle(signed, hmac_key=key).ok
    assert verify_bundle(signed).ok, "without a key the signature is not required"
    assert any("unsigned" in p for p in verify_bundle(unsigned, hmac_key=key).problems)
    assert any("signature" in p for p in verify_bundle(signed, hmac_key=b"other").problems)
    doc = json.loads((signed / "manifest.json").read_text())
    doc["step"] = 2
    doc["replay"]["groups"] = 99  # tamper with a signed field
    (signed / "manifest.json").write_text(json.dumps(doc))
    assert any("signature" in p for p in verify_bundle(signed, hmac_key=key).problems)
    monkeypatch.setenv(HMAC_ENV, "abc")
    assert hmac_key_from_env().keys == (b"abc",)
    monkeypatch.delenv(HMAC_ENV)
    assert hmac_key_from_env() is None


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.__setitem__("step", "two"), id="step-not-int"),
        pytest.param(lambda d: d.__setitem__("files", []), id="files-not-mapping"),
        pytest.param(lambda d: d["files"].__setitem__("policy/model.pt", "abc"), id="file-entry-not-mapping"),
        pytest.param(lambda d: d.__setitem__("replay", ["x"]), id="replay-not-mapping"),
        pytest.param(lambda d: d["replay"].pop("digest"), id="replay-without-digest"),
        pytest.param(lambda d: d.__setitem__("compat", "x"), id="compat-not-mapping"),
    ],
)
def test_malformed_manifest_is_a_problem_not_a_crash(tmp_path: Path, edit: Any) -> None:
    """Valid JSON with the wrong shapes (hand-edited, or a bit flip that kept it parseable) is reported, naming
    manifest.json — never a traceback out of ``ckpt verify`` or ``plan_resume``."""
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    edit_manifest(bundle, edit)
    report = verify_bundle(bundle, expected_compat=COMPAT)
    assert not report.ok
    assert any(str(bundle / "manifest.json") in p for p in report.problems), report.problems
    report.as_dict()  # what `ckpt list/verify --json` print must not crash either
    plan = plan_resume(tmp_path, on_corrupt="fallback", expected_compat=COMPAT)
    assert plan.decision == "resume" and plan.step == 2


def test_hashes_under_a_directory_are_keyed_by_their_path_inside_it(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    manifest = read_manifest(bundle)
    policy = manifest.hashes_under("policy")
    assert policy
    for name, labelled in policy.items():
        assert labelled == "blake3:" + manifest.files[f"policy/{name}"]["digest"]
    assert not any(name.startswith("policy/") for name in policy)
    assert set(manifest.hashes_under("data_plane")) == {
        rel.removeprefix("data_plane/") for rel in manifest.files if rel.startswith("data_plane/")
    }
    assert manifest.dataset is None, "a bundle of a task without a dataset file records none"
