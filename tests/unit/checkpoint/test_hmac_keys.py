"""The HMAC keyring: key ids in manifests, the newest key signs, every older key still verifies, the key comes from a
mounted file (a Secret's directory layout included), the environment variable still works (deprecated). Rotating
keys leaves every bundle verifiable and moves nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sc_app.checkpoint import plan_resume, verify_bundle
from sc_app.checkpoint.hmac_keys import (
    HMAC_ENV,
    HMAC_FILE_ENV,
    HmacKeyError,
    Keyring,
    key_id,
    keyring_from_env,
    ring_from_path,
)
from sc_app.checkpoint.manifest import ManifestError, parse_manifest, sign
from tests.support.bundles import make_bundle

K1, K2, K3 = b"key-2026-01", b"key-2026-06", b"key-2026-12"


def _raw(bundle: Path) -> bytes:
    return (bundle / "manifest.json").read_bytes()


def _without_key_id(bundle: Path) -> None:
    """The manifest as sc-app wrote it before key ids: the id is a label outside the signed bytes."""
    raw = _raw(bundle)
    kid = json.loads(raw)["signature"]["key_id"]
    (bundle / "manifest.json").write_bytes(raw.replace(f'"key_id": "{kid}", '.encode(), b""))


def _doc_signed(bundle: Path, key: bytes) -> None:
    """The oldest form: ``hmac-sha256`` over the parsed document, no key id."""
    doc = json.loads(_raw(bundle))
    doc.pop("signature")
    (bundle / "manifest.json").write_text(json.dumps(sign(doc, key), indent=2))


def secret_dir(root: Path, keys: dict[str, bytes]) -> Path:
    """A directory laid out like a mounted Secret: ..data -> ..<ts>/, and one link per key into ..data."""
    mount = root / "hmac"
    data = mount / "..2026_12_02_07_00_00.000000000"
    data.mkdir(parents=True)
    for name, key in keys.items():
        (data / name).write_bytes(key + b"\n")
    os.symlink(data.name, mount / "..data")
    for name in keys:
        os.symlink(f"..data/{name}", mount / name)
    return mount


def test_a_manifest_names_its_signing_key_and_the_newest_key_of_a_ring_signs(tmp_path: Path) -> None:
    ring = Keyring((K1, K2))
    bundle = make_bundle(tmp_path, 2, hmac_key=ring)
    sig = json.loads(_raw(bundle))["signature"]
    assert sig["key_id"] == key_id(K2) != key_id(K1) and len(sig["key_id"]) == 16
    assert K2.hex() not in json.dumps(sig) and K2.decode() not in _raw(bundle).decode()
    assert parse_manifest(_raw(bundle), bundle, hmac_key=K2).step == 2
    assert parse_manifest(_raw(bundle), bundle, hmac_key=Keyring((K2, K3))).step == 2


def test_rotating_keys_leaves_every_old_bundle_verifiable_and_moves_nothing(tmp_path: Path) -> None:
    """Bundles of three eras (document-signed, byte-signed without id, with id) under K1, one with id under K2;
    the ring K1, K2, K3 verifies all of them and plan_resume picks the newest; K3 alone refuses each in one line
    naming the key id and moves nothing."""
    ckpt = tmp_path / "ckpt"
    old_doc = make_bundle(ckpt, 2, hmac_key=K1)
    _doc_signed(old_doc, K1)
    old_bytes = make_bundle(ckpt, 4, hmac_key=K1)
    _without_key_id(old_bytes)
    with_id = make_bundle(ckpt, 6, hmac_key=K1)
    rotated = make_bundle(ckpt, 8, hmac_key=Keyring((K1, K2)))
    before = sorted(p.name for p in ckpt.iterdir())
    ring = ring_from_path(secret_dir(tmp_path, {"a-2026-01": K1, "b-2026-06": K2, "c-2026-12": K3}))
    assert ring.signing == K3 and ring.keys == (K1, K2, K3)
    for bundle in (old_doc, old_bytes, with_id, rotated):
        report = verify_bundle(bundle, hmac_key=ring)
        assert report.ok, (bundle.name, report.problems)
    plan = plan_resume(ckpt, hmac_key=ring, tidy=False)
    assert plan.bundle is not None and plan.bundle.name == "step_8"
    newest = make_bundle(ckpt, 10, hmac_key=ring)
    assert json.loads(_raw(newest))["signature"]["key_id"] == key_id(K3)
    for bundle, wants in ((with_id, f"signature is by key id {key_id(K1)}, which is not in the keyring"),
                          (old_bytes, "signature does not match"), (old_doc, "signature does not match")):  # fmt: skip
        report = verify_bundle(bundle, hmac_key=K3)
        assert not report.ok and any(wants in p for p in report.problems), report.problems
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*before, "step_10"]), "verification moves nothing"


def test_a_changed_key_id_only_picks_another_key(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2, hmac_key=K1)
    raw = _raw(bundle)
    forged = raw.replace(key_id(K1).encode(), key_id(K2).encode())
    with pytest.raises(ManifestError, match="signature does not match"):
        parse_manifest(forged, bundle, hmac_key=Keyring((K1, K2)))
    with pytest.raises(ManifestError, match="malformed key_id"):
        parse_manifest(raw.replace(key_id(K1).encode(), b"../../etc/passwd"), bundle, hmac_key=K1)


def test_key_sources_file_lines_directory_and_the_deprecated_env(tmp_path: Path, caplog) -> None:
    lines = tmp_path / "keys"
    lines.write_bytes(K1 + b"\n\n" + K2 + b"\n")
    assert keyring_from_env({HMAC_FILE_ENV: str(lines)}) == Keyring((K1, K2))
    single = tmp_path / "key"
    single.write_bytes(K1)  # a Secret key without a trailing newline
    assert keyring_from_env({HMAC_FILE_ENV: str(single)}) == Keyring((K1,))
    assert keyring_from_env({HMAC_ENV: "abc"}) == Keyring((b"abc",))
    assert keyring_from_env({}) is None


@pytest.mark.parametrize(("env", "expected"), [
    ({HMAC_FILE_ENV: "/nonexistent/hmac"}, f"{HMAC_FILE_ENV}=/nonexistent/hmac does not exist; mount the key Secret"),
    ({HMAC_FILE_ENV: ""}, f"{HMAC_FILE_ENV} is set but empty"),
    ({HMAC_FILE_ENV: "EMPTY"}, "holds no key"),
    ({HMAC_FILE_ENV: "EMPTYDIR"}, "holds no key"),
    ({HMAC_FILE_ENV: "x", HMAC_ENV: "y"}, f"both {HMAC_FILE_ENV} and {HMAC_ENV} are set"),
    ({HMAC_ENV: " "}, f"{HMAC_ENV} is set but empty"),
])  # fmt: skip
def test_unusable_key_sources_are_one_line(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    (tmp_path / "empty").write_bytes(b"\n")
    (tmp_path / "emptydir").mkdir()
    env = {k: {"EMPTY": str(tmp_path / "empty"), "EMPTYDIR": str(tmp_path / "emptydir")}.get(v, v)
           for k, v in env.items()}  # fmt: skip
    with pytest.raises(HmacKeyError) as exc:
        keyring_from_env(env)
    assert expected in str(exc.value) and "\n" not in str(exc.value), exc.value
