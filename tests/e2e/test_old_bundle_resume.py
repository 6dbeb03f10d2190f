"""A bundle written before the file-hash change (``tests/fixtures/bundle_v1_sha256``: manifest schema 1, sha256
digests, HMAC-signed) resumes under the code of today: the real ``sc-app run`` picks it, restores its policy, loader
place and streamed data plane, trains on, and writes new bundles with blake3 digests that verify beside it —
with the HMAC key configured, so the old signature is checked, not skipped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.cli import InProcess
from tests.support.proc import read_trace, run_args, sc_app

pytestmark = pytest.mark.slow  # a real run: Ray, TransferQueue, training
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundle_v1_sha256"
KEY_ENV = {"SC_APP_CHECKPOINT_HMAC_KEY": "old-format-fixture-key"}  # the fixture's key (its README)


def test_an_old_sha256_bundle_resumes_and_new_bundles_are_blake3(cli: InProcess, tmp_path: Path) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    shutil.copytree(FIXTURE, ckpt)
    old_manifest = (ckpt / "step_2" / "manifest.json").read_bytes()
    run = sc_app(*run_args(ckpt, trace, 4), env=KEY_ENV, timeout=600)
    assert run.rc == 0, run.out[-3000:]
    assert f"resuming from {ckpt / 'step_2'} (step 2)" in run.out, run.out[-3000:]
    assert "done: step 4" in run.out, run.out[-3000:]
    trains = [e["step"] for e in read_trace(trace) if e["ev"] == "train"]
    assert trains and min(trains) == 3, f"training must go on from step 3, the trace says {trains}"
    assert (ckpt / "step_2" / "manifest.json").read_bytes() == old_manifest, "the old bundle was changed"
    new = json.loads((ckpt / "step_4" / "manifest.json").read_text())
    assert (new["schema_version"], new["hash_alg"]) == (2, "blake3")
    assert new["lineage"] == json.loads((ckpt / "LINEAGE").read_text())["lineage"], "same lineage as the old bundle"
    verify = cli("ckpt", "verify", "--json", "--checkpoint-dir", str(ckpt), env=KEY_ENV)
    assert verify.rc == 0, verify.out
    reports = {r["name"]: r for r in json.loads(verify.stdout)}
    assert {n: (r["ok"], r["hash_alg"], r["schema_version"]) for n, r in reports.items()} == {
        "step_2": (True, "sha256", 1),
        "step_4": (True, "blake3", 2),
    }
    human = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt), env=KEY_ENV)
    assert (
        "step_2: verified (sha256 file digests)" in human.out and "step_4: verified (blake3 file digests)" in human.out
    )
