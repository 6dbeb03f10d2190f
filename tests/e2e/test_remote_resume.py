"""Resume from the bucket, with the one real run this costs: a bucket holding a real bundle (the schema-1 fixture
``tests/fixtures/bundle_v1_sha256``, uploaded by the remote tier's own code), an *empty* checkpoint directory (a new
cluster, another zone, an emptyDir), the real ``sc-app run`` with ``checkpoint.remote`` set. The run brings the
bundle home, resumes it, trains on, uploads its own bundles behind training, and at its end the bucket lists them,
published under the run's epoch; the newest one verifies on the bucket and resumes into yet another empty dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.remote.bundles import check
from sc_app.checkpoint.remote.fence import acquire, read_record
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.sync import bring_newer
from sc_app.checkpoint.remote.upload import upload_bundle
from sc_app.observe.reader import read_history
from tests.support.proc import read_trace, run_args, sc_app

pytestmark = pytest.mark.slow  # a real run: Ray, TransferQueue, training
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundle_v1_sha256"
KEY = b"old-format-fixture-key"  # the fixture's HMAC key (its README)
LINEAGE = json.loads((FIXTURE / "LINEAGE").read_text())["lineage"]


def remote_args(cfg: Any) -> list[str]:
    sets = [f"checkpoint.remote.{k}={getattr(cfg, k)}" for k in ("url", "endpoint", "region", "addressing_style")]
    return [a for kv in sets for a in ("--set", kv)]


def test_a_run_resumes_from_the_bucket_into_an_empty_dir_and_uploads_behind_training(
    s3_remote: Any, rgw: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SC_APP_CHECKPOINT_HMAC_KEY", KEY.decode())
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    seeded = upload_bundle(store, FIXTURE / "step_2", acquire(store, "seed", LINEAGE), hmac_key=KEY, deadline_s=120)
    assert seeded.published

    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    env = {"SC_APP_CHECKPOINT_HMAC_KEY": KEY.decode(), **rgw.env()}
    run = sc_app(*run_args(ckpt, trace, 4), *remote_args(s3_remote), env=env, timeout=600)
    assert run.rc == 0, run.out[-3000:]
    assert f"resuming from {ckpt / 'step_2'} (step 2)" in run.out, run.out[-3000:]
    assert "done: step 4" in run.out, run.out[-3000:]
    trains = [e["step"] for e in read_trace(trace) if e["ev"] == "train"]
    assert trains and min(trains) == 3, f"training must go on from step 3, the trace says {trains}"
    assert (ckpt / "step_2" / "manifest.json").read_bytes() == (FIXTURE / "step_2" / "manifest.json").read_bytes()
    assert "uploaded step_4 (" in run.out, run.out[-3000:]  # reported as the run goes, and in the run log:
    uploads = [e for e in read_history(ckpt / "logs").events if e.name == "upload"]
    assert [(e.step, e.data["bundle"]) for e in uploads] == [(4, "step_4")] and uploads[0].data["bytes"] > 0

    record, _ = read_record(store)
    assert record is not None and record.lineage == LINEAGE and record.epoch == 2
    assert [(b.step, b.epoch) for b in record.bundles] == [(2, 1), (4, 2)]  # step_2 was not uploaded twice
    newest = check(store, record.newest_first()[0], lineage=LINEAGE, hmac_key=KEY, digests=True)
    assert newest.ok, newest.problems
    again = bring_newer(store, record, tmp_path / "elsewhere", local_newest=lambda: None, lineage=LINEAGE,
                        hmac_key=KEY, concurrency=4)  # fmt: skip
    assert again is not None and again.step == 4
    assert (again.path / "manifest.json").read_bytes() == (ckpt / "step_4" / "manifest.json").read_bytes()
    assert verify_bundle(again.path, hmac_key=KEY).ok
