"""The manifest's file hash algorithm: bundles written now say ``hash_alg: blake3`` (schema 2); bundles written
before (schema 1, sha256, ``tests/fixtures/bundle_v1_sha256``) still verify; the HMAC covers the algorithm's name
and every digest; tampering is caught with either algorithm."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import blake3
import pytest

from sc_app.checkpoint import BundleWriter, verify_bundle
from sc_app.checkpoint.manifest import ManifestError, read_manifest
from tests.support.bundles import edit_manifest, flip_byte, make_bundle, write_contents

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bundle_v1_sha256"
FIXTURE_KEY = b"old-format-fixture-key"  # the key the fixture's manifest is signed with (its README)


@pytest.fixture
def old_bundle(tmp_path: Path) -> Path:
    """A copy of the committed schema-1 bundle (the fixture itself is never touched)."""
    shutil.copytree(FIXTURE, tmp_path / "ckpt")
    return tmp_path / "ckpt" / "step_2"


def test_a_new_bundle_names_blake3_and_lists_blake3_digests(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    doc = json.loads((bundle / "manifest.json").read_text())
    assert (doc["schema_version"], doc["hash_alg"]) == (2, "blake3")
    for rel, entry in doc["files"].items():
        assert entry == {"digest": blake3.blake3((bundle / rel).read_bytes()).hexdigest(), "size": entry["size"]}
    report = verify_bundle(bundle)
    assert report.ok, report.problems
    assert (report.as_dict()["hash_alg"], report.as_dict()["schema_version"]) == ("blake3", 2)


def test_a_writer_can_still_write_sha256_and_it_verifies(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path, 2, hash_alg="sha256").begin()
    bundle = w.commit(write_contents(w, 2))  # the streamed data plane came hashed with blake3: hashed again
    manifest = read_manifest(bundle)
    assert manifest.hash_alg == "sha256"
    for rel, entry in manifest.files.items():
        assert entry["digest"] == hashlib.sha256((bundle / rel).read_bytes()).hexdigest(), rel
    assert verify_bundle(bundle).ok


def test_the_committed_old_bundle_verifies_with_and_without_its_key(old_bundle: Path) -> None:
    doc = json.loads((old_bundle / "manifest.json").read_text())
    assert doc["schema_version"] == 1 and "hash_alg" not in doc, "the fixture must stay an old-format bundle"
    for report in (verify_bundle(old_bundle), verify_bundle(old_bundle, hmac_key=FIXTURE_KEY)):
        assert report.ok, report.problems
        assert (report.as_dict()["hash_alg"], report.as_dict()["schema_version"]) == ("sha256", 1)
    manifest = read_manifest(old_bundle)
    assert manifest.hashes_under("policy")["model.pt"] == "sha256:" + doc["files"]["policy/model.pt"]["sha256"]
    assert any("signature" in p for p in verify_bundle(old_bundle, hmac_key=b"another key").problems)


@pytest.mark.parametrize("rel", ["policy/model.pt", "data_plane/part-00-00000.bin", "train_dataloader.pt"])
def test_tampering_with_an_old_bundle_is_caught_by_sha256(old_bundle: Path, rel: str) -> None:
    flip_byte(old_bundle / rel)
    problems = verify_bundle(old_bundle).problems
    assert any(rel in p and "sha256 does not match the manifest" in p for p in problems), problems


@pytest.mark.parametrize("rel", ["policy/optimizer.pt", "data_plane/part-00-00000.bin", "replay_buffer_metadata.pt"])
def test_tampering_with_a_new_bundle_is_caught_by_blake3(tmp_path: Path, rel: str) -> None:
    bundle = make_bundle(tmp_path, 2)
    flip_byte(bundle / rel)
    problems = verify_bundle(bundle).problems
    assert any(rel in p and "blake3 does not match the manifest" in p for p in problems), problems


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.__setitem__("hash_alg", "sha256"), id="algorithm-renamed"),
        pytest.param(lambda d: d["files"]["policy/model.pt"].__setitem__("digest", "0" * 64), id="digest-changed"),
        pytest.param(lambda d: d["files"].pop("policy/model.pt"), id="entry-dropped"),
    ],
)
def test_the_signature_covers_the_algorithm_and_every_digest(tmp_path: Path, edit: Any) -> None:
    bundle = make_bundle(tmp_path, 2, hmac_key=b"k")
    assert verify_bundle(bundle, hmac_key=b"k").ok
    edit_manifest(bundle, edit)
    problems = verify_bundle(bundle, hmac_key=b"k").problems
    assert any("manifest signature does not match" in p for p in problems), problems


def test_the_old_bundles_signature_covers_its_digests(old_bundle: Path) -> None:
    edit_manifest(old_bundle, lambda d: d["files"]["policy/model.pt"].__setitem__("sha256", "0" * 64))
    assert any("signature does not match" in p for p in verify_bundle(old_bundle, hmac_key=FIXTURE_KEY).problems)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.pop("hash_alg"), "hash_alg"),
        (lambda d: d.__setitem__("hash_alg", "md5"), "hash_alg"),
        (lambda d: d.__setitem__("schema_version", 1), "sha256"),  # schema 1 entries are {"sha256", "size"}
        (lambda d: d["files"].__setitem__("x", {"sha256": "0" * 64, "size": 1}), "digest"),
        (lambda d: d.__setitem__("schema_version", 3), "schema_version"),
    ],
)
def test_a_manifest_whose_algorithm_or_entries_do_not_fit_its_schema_is_refused(
    tmp_path: Path, edit: Any, needle: str
) -> None:
    bundle = make_bundle(tmp_path, 2)
    edit_manifest(bundle, edit)
    with pytest.raises(ManifestError, match=needle):
        read_manifest(bundle)


def test_an_old_manifest_naming_an_algorithm_is_refused(old_bundle: Path) -> None:
    edit_manifest(old_bundle, lambda d: d.__setitem__("hash_alg", "blake3"))
    with pytest.raises(ManifestError, match="hash_alg"):
        read_manifest(old_bundle)
