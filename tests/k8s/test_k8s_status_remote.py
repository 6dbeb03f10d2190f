"""``sc-app k8s status`` with ``config.checkpoint.remote`` in the values: the bucket's newest bundle that counts and
who holds the bucket, read from the real radosgw; the API server is the suite's stand-in (``fake_apiserver``). A
bucket that cannot be read is one line and the rest of the status still shows."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")
pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

from sc_app.checkpoint.remote.fence import BUNDLES, acquire
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.upload import upload_bundle
from tests.k8s.test_k8s_cli import JOB, _seed_running_job, run
from tests.support.bundles import make_bundle

LINEAGE = "lineage-k8s-status"
PLAN = {"decision": "resume", "reason": "newest verified bundle", "bundle": "/checkpoints/step_2", "step": 2,
        "checked": [], "quarantined": []}  # fmt: skip


def remote_sets(cfg: Any) -> list[str]:
    keys = ("url", "endpoint", "region", "addressing_style")
    sets = [f"config.checkpoint.remote.{k}={getattr(cfg, k)}" for k in keys]
    return [a for kv in sets for a in ("--set", kv)]


def test_status_shows_the_buckets_newest_bundle_that_counts(api, capsys, s3_remote: Any, rgw: Any,
                                                            tmp_path: Path) -> None:  # fmt: skip
    server, kc = api
    _seed_running_job(server, json.dumps(PLAN))
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    assert run(kc, "status", "--no-live", *remote_sets(s3_remote)) == 0
    assert f"bucket {s3_remote.url}: no bundle published yet (no fencing record there)" in capsys.readouterr().out
    lease = acquire(store, "run-a", LINEAGE)
    for step in (2, 4, 6):
        upload_bundle(store, make_bundle(tmp_path, step, lineage=LINEAGE), lease, hmac_key=None, deadline_s=60)
    rgw.client().delete_object(Bucket=rgw.bucket, Key=store.key(BUNDLES, "step_6.run-a.e1", "train_dataloader.pt"))

    assert run(kc, "status", "--no-live", *remote_sets(s3_remote)) == 0
    out = capsys.readouterr().out
    assert f"rayjob/{JOB}: Running, job RUNNING" in out and "step 2 [resume]" in out
    line = next(ln for ln in out.splitlines() if ln.startswith(f"newest bundle on {s3_remote.url}:"))
    assert line.startswith(f"newest bundle on {s3_remote.url}: step 4 (step_4.run-a.e1, published by run run-a "
                           "(epoch 1) at ")  # fmt: skip
    assert line.endswith("; 1 newer do not count; held by run run-a (epoch 1)"), line
    assert run(kc, "status", "--no-live", "--json", *remote_sets(s3_remote)) == 0
    doc = json.loads(capsys.readouterr().out)["remote"]
    assert (doc["newestStep"], doc["holder"], doc["error"]) == (4, "run run-a (epoch 1)", None)
    assert doc["passedOver"][0].startswith("step_6 (step_6.run-a.e1): train_dataloader.pt: missing on the server")

    assert run(kc, "status", "--no-live", "--no-remote", *remote_sets(s3_remote)) == 0
    assert "newest bundle on" not in capsys.readouterr().out
    assert run(kc, "status", "--no-live") == 0  # values without a bucket: no bucket line
    assert "bucket" not in capsys.readouterr().out


def test_a_bucket_that_does_not_answer_is_one_line_and_the_rest_shows(api, capsys, monkeypatch) -> None:
    server, kc = api
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
    _seed_running_job(server, json.dumps(PLAN))
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        rc = run(kc, "status", "--no-live", "--request-timeout", "2", "--set", "config.checkpoint.remote.url=s3://bkt/p",
                 "--set", f"config.checkpoint.remote.endpoint={endpoint}")  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "step 2 [resume]" in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("bucket s3://bkt/p: ")]
    assert "s3://bkt/p/LEASE" in line and "timeout" in line.lower(), line
