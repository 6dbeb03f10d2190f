"""Every JSON file of a bundle, whatever its bytes — any shape, any depth, any size — is a named problem, never a
crash (``RecursionError``, ``MemoryError``, ``UnicodeDecodeError``) or a hang, in ``verify``, ``plan_resume`` and
``ckpt list/verify --json``; ``on_corrupt=fallback`` goes on to the older good bundle."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sc_app.checkpoint import plan_resume, verify_bundle
from sc_app.checkpoint.verify import BundleReport
from sc_app.cli import main
from tests.support.bundles import edit_manifest, make_bundle, reseal
from tests.support.proc import finishes

JSON_FILES = ["manifest.json", "data_plane/metadata.json", "data_plane/part-00-00000.json"]
TEN_GB = 10 * 1024**3

CONTENTS: dict[str, Callable[[bytes], bytes]] = {
    "100,000 deep arrays": lambda _: b"[" * 100_000 + b"]" * 100_000,
    "100,000 deep objects": lambda _: b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "deep inside a valid document": lambda good: (
        good.rstrip()[:-1] + b', "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    ),
    "an array": lambda _: b"[1, 2]",
    "a string": lambda _: b'"just a string"',
    "null": lambda _: b"null",
    "empty": lambda _: b"",
    "truncated": lambda good: good[: len(good) // 2],
    "NaN": lambda good: good.rstrip()[:-1] + b', "x": NaN}',
    "an integer of 5000 digits": lambda good: good.rstrip()[:-1] + b', "x": ' + b"9" * 5000 + b"}",
    "invalid UTF-8": lambda good: good.rstrip()[:-1] + b', "x": "\xff\xfe"}',
    "a byte-order mark": lambda good: b"\xef\xbb\xbf" + good,
    "a key twice with an extra key": lambda good: good.rstrip()[:-1] + b', "extra": 1, "extra": 2}',
}


def _check(tmp_path: Path, bundle: Path, rel: str, capsys: pytest.CaptureFixture[str]) -> BundleReport:
    report: BundleReport = finishes(lambda: verify_bundle(bundle))
    assert any(p.startswith(f"{bundle / rel}:") for p in report.problems), report.problems
    json.dumps(report.as_dict())
    for argv in (["ckpt", "verify", "--json"], ["ckpt", "list", "--json"]):
        capsys.readouterr()
        rc = finishes(lambda argv=argv: main([*argv, "--checkpoint-dir", str(tmp_path)]))
        out = json.loads(capsys.readouterr().out)
        assert rc in (0, 2) and out, argv
    plan = finishes(lambda: plan_resume(tmp_path, tidy=False))
    assert plan.decision == "resume" and plan.step == 2, plan.reason
    return report


@pytest.mark.parametrize("content", list(CONTENTS))
@pytest.mark.parametrize("rel", JSON_FILES)
def test_any_json_content_is_a_named_problem(
    tmp_path: Path, rel: str, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    good = (bundle / rel).read_bytes()
    (bundle / rel).write_bytes(CONTENTS[content](good))
    if rel != "manifest.json":
        reseal(bundle)  # hashes match: only the parse can object
    _check(tmp_path, bundle, rel, capsys)


@pytest.mark.parametrize("rel", JSON_FILES)
def test_a_ten_gigabyte_json_file_is_refused_unread(
    tmp_path: Path, rel: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sparse 10 GB file: refused by its size (the manifest's and the file's) before a byte is read or hashed."""
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    with open(bundle / rel, "r+b") as f:
        f.truncate(TEN_GB)
    if rel != "manifest.json":
        edit_manifest(bundle, lambda d: d["files"][rel].update(size=TEN_GB))
    report = _check(tmp_path, bundle, rel, capsys)
    assert any("more than the" in p for p in report.problems), report.problems
