"""``sc-app ckpt list|verify --remote``: the bucket's bundles as the operator sees them (real radosgw)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sc_app.checkpoint.remote.fence import BUNDLES, acquire
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.upload import upload_bundle
from sc_app.config.app import dump_config
from tests.support.bundles import CFG, make_bundle
from tests.support.cli import InProcess

LINEAGE = "lineage-cli"


def flags(cfg: Any) -> list[str]:
    return ["--remote", cfg.url, "--endpoint", cfg.endpoint, "--region", cfg.region, "--addressing-style", "path"]


def test_list_and_verify_the_bucket(cli: InProcess, s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    zombie = acquire(store, "run-old", LINEAGE)
    lease = acquire(store, "run-new", LINEAGE)
    for step in (2, 4):
        upload_bundle(store, make_bundle(tmp_path, step, lineage=LINEAGE), lease, hmac_key=None, deadline_s=60)
    key = store.key(BUNDLES, "step_6.run-old.e1", "manifest.json")  # a superseded attempt's upload
    rgw.client().put_object(Bucket=rgw.bucket, Key=key, Body=(tmp_path / "step_4" / "manifest.json").read_bytes())
    del zombie

    listed = cli("ckpt", "list", *flags(s3_remote), "--json")
    assert listed.rc == 0, listed.out
    doc = json.loads(listed.stdout)
    assert [(b["name"], b["ok"], b["epoch"]) for b in doc["bundles"]] == [("step_4", True, 2), ("step_2", True, 2)]
    assert doc["unpublished"] == ["step_6.run-old.e1"] and doc["holder"] == {"run_id": "run-new", "epoch": 2}
    assert cli("ckpt", "verify", *flags(s3_remote)).rc == 0

    loader = store.key(BUNDLES, "step_2.run-new.e2", "train_dataloader.pt")
    size = (tmp_path / "step_2" / "train_dataloader.pt").stat().st_size
    rgw.client().put_object(Bucket=rgw.bucket, Key=loader, Body=b"\1" * size)
    bad = cli("ckpt", "verify", *flags(s3_remote))
    assert bad.rc == 2, bad.out
    assert "step_4" in bad.stdout and "step_2" in bad.stdout
    assert "BAD: train_dataloader.pt: its bytes on the server do not match the manifest's digest" in bad.stdout


def test_exactly_one_tier(cli: InProcess, tmp_path: Path) -> None:
    both = cli("ckpt", "list", "--checkpoint-dir", str(tmp_path), "--remote", "s3://bkt/p")
    neither = cli("ckpt", "verify")
    for out in (both, neither):
        assert out.rc == 2 and out.errors() == [
            "sc-app: error: give exactly one of --checkpoint-dir DIR and --remote s3://bucket/prefix"
        ], out.stderr


def test_preflight_brings_the_buckets_newest_home_and_decides_to_resume_it(
    cli: InProcess, s3_remote: Any, tmp_path: Path
) -> None:
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    lease = acquire(store, "run-a", LINEAGE)
    for step in (2, 4):
        upload_bundle(store, make_bundle(tmp_path / "a", step, lineage=LINEAGE), lease, hmac_key=None, deadline_s=60)
    config = tmp_path / "job.yaml"
    config.write_text(dump_config(CFG))
    sets = [
        a for k in ("url", "endpoint", "region") for a in ("--set", f"checkpoint.remote.{k}={getattr(s3_remote, k)}")
    ]
    ckpt = tmp_path / "empty"
    out = cli("preflight", "--checkpoint-dir", str(ckpt), "--config", str(config), *sets, "--set",
              "checkpoint.remote.addressing_style=path")  # fmt: skip
    assert out.rc == 0, out.out
    assert f"brought step_4 home from {s3_remote.url}" in out.stdout
    assert "checked step_4: ok\ndecision: resume step_4 (step 4)" in out.stdout, out.stdout
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_4"]  # only the newest is brought


def test_prune_the_bucket_by_the_local_rules(cli: InProcess, s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    """The newest bundle that counts is the anchor and stays; a newer one that does not count is left alone; an
    older one that does not count is left for the operator; the others beyond --keep leave the record, then their
    objects go."""
    store, _ = open_bucket(s3_remote, lineage=LINEAGE)
    lease = acquire(store, "run-a", LINEAGE)
    for step in (2, 4, 6, 8, 10):
        upload_bundle(store, make_bundle(tmp_path, step, lineage=LINEAGE), lease, hmac_key=None, deadline_s=60)
    c = rgw.client()
    c.delete_object(Bucket=rgw.bucket, Key=store.key(BUNDLES, "step_10.run-a.e1", "manifest.json"))  # 10: no count
    c.delete_object(Bucket=rgw.bucket, Key=store.key(BUNDLES, "step_4.run-a.e1", "train_dataloader.pt"))  # 4: no count
    out = cli("ckpt", "prune", *flags(s3_remote), "--keep", "2", "--json")
    assert out.rc == 0, out.out
    assert json.loads(out.stdout) == {"removed": ["step_2"]}  # anchor 8, kept 6; 4 does not count; 2 goes
    listed = json.loads(cli("ckpt", "list", *flags(s3_remote), "--json").stdout)
    assert [b["name"] for b in listed["bundles"]] == ["step_10", "step_8", "step_6", "step_4"]
    assert list(store.list(store.key(BUNDLES, "step_2.run-a.e1") + "/")) == []  # its objects are gone too
    assert "step_2.run-a.e1" not in listed["unpublished"]
