"""The bucket's fencing record and the remote config, pure: parse, refuse, take over, list bundles."""

from __future__ import annotations

import json

import pytest

from sc_app.checkpoint.remote.record import MAX_LISTED, Published, RecordError, RemoteRecord, bundle_dir
from sc_app.config.app import load_config
from sc_app.config.remote import parse_s3_url
from sc_app.config.tree import ConfigError


def entry(step: int, epoch: int = 1) -> Published:
    return Published(step, bundle_dir(step, "r", epoch), "a" * 64, "r", epoch, "20261202T000000Z")


def test_a_record_round_trips_and_a_takeover_moves_the_epoch_on() -> None:
    rec = RemoteRecord("lin", "r", 1, "t0").with_bundle(entry(2)).with_bundle(entry(4))
    assert RemoteRecord.parse("s3://b/LEASE", rec.to_json()) == rec
    taken = rec.taken_by("r2", "t1")
    assert (taken.run_id, taken.epoch, taken.previous, taken.bundles) == (
        "r2",
        2,
        {"run_id": "r", "epoch": 1},
        rec.bundles,
    )
    assert [b.step for b in taken.newest_first()] == [4, 2] and taken.published(4) == entry(4)


def test_the_record_lists_a_bounded_number_of_bundles() -> None:
    rec = RemoteRecord("lin", "r", 1, "t0")
    for step in range(MAX_LISTED + 5):
        rec = rec.with_bundle(entry(step))
    assert len(rec.bundles) == MAX_LISTED and rec.bundles[0].step == 5


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"not json", "not an sc-app remote lease record"),
        (b'{"format": "other"}', "no sc-app format"),
        (
            json.dumps(
                {"format": "sc-app/remote-lease", "lineage": "l", "run_id": "r", "epoch": 0, "acquired_at": "t"}
            ).encode(),
            "epoch must be >= 1",
        ),
        (
            json.dumps(
                {"format": "sc-app/remote-lease", "lineage": "l", "run_id": "r", "epoch": True, "acquired_at": "t"}
            ).encode(),
            "'epoch' is True",
        ),
        (
            json.dumps(
                {
                    "format": "sc-app/remote-lease",
                    "lineage": "l",
                    "run_id": "r",
                    "epoch": 1,
                    "acquired_at": "t",
                    "bundles": [{"step": 1, "dir": "../x", "manifest": "a" * 64, "run_id": "r", "epoch": 1, "at": "t"}],
                }
            ).encode(),
            "not a directory name",
        ),
        (b'{"format": "sc-app/remote-lease", "epoch": 1, "epoch": 2}', "not an sc-app remote lease record"),
    ],
)
def test_a_record_sc_app_did_not_write_is_one_line(raw: bytes, why: str) -> None:
    with pytest.raises(RecordError, match=why) as err:
        RemoteRecord.parse("s3://b/p/LEASE", raw)
    assert "\n" not in str(err.value) and "s3://b/p/LEASE" in str(err.value)


@pytest.mark.parametrize(
    ("url", "bucket", "prefix"),
    [("s3://my-bkt", "my-bkt", ""), ("s3://my-bkt/", "my-bkt", ""), ("s3://my.bkt/a/b/", "my.bkt", "a/b")],
)
def test_s3_urls(url: str, bucket: str, prefix: str) -> None:
    target = parse_s3_url(url)
    assert (target.bucket, target.prefix) == (bucket, prefix)
    assert target.key("LEASE") == "/".join(p for p in (prefix, "LEASE") if p)


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ("checkpoint.remote.url=gs://b/p", "must be s3://bucket/prefix"),
        ("checkpoint.remote.url=s3://UPPER/p", "is not an S3 bucket name"),
        ("checkpoint.remote.url=s3://bkt/a/../b", "prefix"),
        ("checkpoint.remote.endpoint=localhost:9000", "must be an http(s):// URL"),
        ("checkpoint.remote.part_size_mib=4", "greater than or equal to 5"),
        ("checkpoint.remote.secret_access_key=x", "unknown config key"),  # credentials never go in the config
    ],
)
def test_bad_remote_config_is_one_line(setting: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.remote") as err:
        load_config(None, [setting])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_remote_tier_without_checkpoints_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"checkpoint\.remote\.url needs checkpoint\.enabled=true"):
        load_config(None, ["checkpoint.enabled=false", "checkpoint.remote.url=s3://bkt/p"])


def test_quarantined_bundles_round_trip_and_stay_out_of_the_published_list() -> None:
    from sc_app.checkpoint.remote.record import Published, RemoteRecord

    a, b = (Published(s, f"step_{s}.r.e1", "ab" * 32, "r", 1, "t") for s in (2, 4))
    rec = RemoteRecord("lin", "r", 1, "t", (a, b)).quarantine([b], "rolled back to step_2", "t2")
    assert rec.bundles == (a,) and rec.published(4) is None
    again = RemoteRecord.parse("s3://b/LEASE", rec.to_json())
    assert again == rec and again.quarantined[0].bundle == b and again.quarantined[0].why == "rolled back to step_2"
    plain = RemoteRecord("lin", "r", 1, "t", (a,))
    assert b"quarantined" not in plain.to_json(), "a record without a rollback is written as before"
