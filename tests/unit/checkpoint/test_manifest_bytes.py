"""Issue 31 I: a manifest (and every JSON document read through ``strict_json``) with a key twice is refused; the
HMAC covers the manifest's bytes; ``schema_version`` and the other integers are never coerced from floats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.lease import LeaseError, read_lease
from sc_app.checkpoint.lineage import LineageError, read_lineage
from sc_app.checkpoint.manifest import ManifestError, parse_manifest, sign
from sc_app.checkpoint.stop_request import read_stop_request
from sc_app.data_plane import schema
from sc_app.io import strict_json
from tests.support.bundles import make_bundle

KEY = b"k"
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "bundle_v1_sha256"


def _raw(bundle: Path) -> bytes:
    return (bundle / "manifest.json").read_bytes()


@pytest.mark.parametrize(
    "data",
    [b'{"a": 1, "a": 2}', b'{"x": [{"b": 1, "b": 1}]}', b'{"\\u0061": 1, "a": 2}', b'[{"k": {}, "k": {}}]'],
)
def test_strict_json_refuses_a_key_twice(data: bytes) -> None:
    with pytest.raises(ValueError, match="appears twice"):
        strict_json.parse(data)


def test_strict_json_keeps_accepting_repeated_keys_in_different_objects() -> None:
    assert strict_json.parse(b'[{"a": 1}, {"a": 2}]') == [{"a": 1}, {"a": 2}]
    with pytest.raises(ValueError, match="not valid JSON"):
        strict_json.parse(b'{"a": 1' + b"0" * 5000 + b"}")


def test_validate_json_refuses_a_key_twice() -> None:
    class Doc(strict_json.StrictModel):
        n: int

    assert strict_json.validate_json(Doc, b'{"n": 1}').n == 1
    with pytest.raises(ValueError, match="appears twice"):
        strict_json.validate_json(Doc, b'{"n": 1, "n": 2}')


@pytest.mark.parametrize("key", ["step", "hash_alg", "files", "signature"])
def test_a_signed_manifest_with_a_key_twice_is_refused(tmp_path: Path, key: str) -> None:
    """Another parser could read the first value (a different step, a weaker algorithm): never accepted."""
    bundle = make_bundle(tmp_path, 2, hmac_key=KEY)
    doc = json.loads(_raw(bundle))
    extra = json.dumps(doc[key]).encode()
    (bundle / "manifest.json").write_bytes(b'{\n  "%s": %s,' % (key.encode(), extra) + _raw(bundle)[1:])
    for hmac_key in (KEY, None):
        report = verify_bundle(bundle, hmac_key=hmac_key)
        assert any("appears twice" in p for p in report.problems), report.problems


def test_the_signature_covers_the_bytes(tmp_path: Path) -> None:
    """The same document in other bytes (whitespace, key order) is not what was signed."""
    bundle = make_bundle(tmp_path, 2, hmac_key=KEY)
    raw = _raw(bundle)
    assert parse_manifest(raw, bundle, hmac_key=KEY).step == 2
    assert json.loads(raw)["signature"]["alg"] == "hmac-sha256-bytes"
    for changed in (raw.replace(b'\n  "', b'\n   "', 1), json.dumps(json.loads(raw)).encode()):
        with pytest.raises(ManifestError, match="signature does not match"):
            parse_manifest(changed, bundle, hmac_key=KEY)
        assert parse_manifest(changed, bundle).step == 2, "without a key, a signature is not checked"
    with pytest.raises(ManifestError, match=r"signature is by key id [0-9a-f]{16}, which is not in the keyring"):
        parse_manifest(raw, bundle, hmac_key=b"other")


def test_a_manifest_signed_the_old_way_still_verifies(tmp_path: Path) -> None:
    """Bundles on disk today carry ``hmac-sha256`` over the parsed document: never made unverifiable."""
    bundle = make_bundle(tmp_path, 2)
    doc = json.loads(_raw(bundle))
    (bundle / "manifest.json").write_text(json.dumps(sign(doc, KEY), indent=2, sort_keys=True) + "\n")
    assert verify_bundle(bundle, hmac_key=KEY).ok
    assert not verify_bundle(bundle, hmac_key=b"other").ok
    old = tmp_path / "fixture"
    shutil.copytree(FIXTURE, old)
    assert json.loads(_raw(old / "step_2"))["signature"]["alg"] == "hmac-sha256"
    assert verify_bundle(old / "step_2", hmac_key=b"old-format-fixture-key").ok


@pytest.mark.parametrize("version", [b"2.0", b"2e0", b"20e-1", b"true", b'"2"', b"1.0"])
def test_schema_version_is_the_integer_itself(tmp_path: Path, version: bytes) -> None:
    bundle = make_bundle(tmp_path, 2)
    raw = _raw(bundle).replace(b'"schema_version": 2', b'"schema_version": ' + version)
    with pytest.raises(ManifestError, match="schema_version"):
        parse_manifest(raw, bundle)


@pytest.mark.parametrize("field", ['"step": 2', '"size": ', '"groups": ', '"next_index": ', '"epoch": 1'])
def test_no_integer_of_the_manifest_is_coerced_from_a_float(tmp_path: Path, field: str) -> None:
    bundle = make_bundle(tmp_path, 2)
    raw = _raw(bundle)
    at = raw.index(field.encode()) + len(field.split(":")[0]) + 2
    end = at + len(raw[at:].split(b",")[0].split(b"\n")[0])
    changed = raw[:at] + raw[at:end] + b".0" + raw[end:]
    with pytest.raises(ManifestError, match="schema"):
        parse_manifest(changed, bundle)


def test_every_file_read_through_strict_json_refuses_a_key_twice(tmp_path: Path) -> None:
    """The class: LEASE, LINEAGE, STOP and the data plane's metadata.json."""
    lease = b'{"run_id": "a", "epoch": 1, "epoch": 9, "host": "h", "pid": 1, "acquired_at": "t",'
    (tmp_path / "LEASE").write_bytes(lease + b' "heartbeat_at": 1.0, "ttl_s": 30.0}')
    with pytest.raises(LeaseError, match="appears twice"):
        read_lease(tmp_path)
    (tmp_path / "LINEAGE").write_bytes(b'{"lineage": "a", "lineage": "b"}')
    with pytest.raises(LineageError, match="appears twice"):
        read_lineage(tmp_path)
    (tmp_path / "STOP").write_bytes(b'{"run_id": "a", "epoch": 1, "epoch": 2, "requested_at": "t", "by": "x"}')
    assert read_stop_request(tmp_path) is None, "a request that says two things addresses no run"
    (tmp_path / "STOP").write_bytes(b'{"run_id": "a", "epoch": 1.0, "requested_at": "t", "by": "x"}')
    assert read_stop_request(tmp_path) is None, "no coercion of the epoch either"
    with pytest.raises(ValueError, match="appears twice"):
        schema.snapshot_format(b'{"format": "sc-app/streamed-v2", "format": "other"}')


def test_a_compat_value_of_another_type_is_a_mismatch() -> None:
    from sc_app.checkpoint.verify import compat_problems

    assert compat_problems({"grpo.group_size": 2, "run.seed": 0}, {"grpo.group_size": 2, "run.seed": 0}) == []
    problems = compat_problems({"grpo.group_size": 2.0, "run.seed": False}, {"grpo.group_size": 2, "run.seed": 0})
    assert len(problems) == 2 and "2.0 in the bundle but 2" in problems[0]
