"""The remote tier against a real S3 server (Ceph RADOS Gateway, ``tests/support/rgw.py``): upload, publish, check,
download; the faults (a changed object, a manifest without its files, a multipart upload left behind, the server
killed mid-upload) and two attempts on one bucket. Bundles are built by hand (``tests/support/bundles.py``): no Ray.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.remote import fence, upload
from sc_app.checkpoint.remote.bundles import check, download
from sc_app.checkpoint.remote.fence import BUNDLES, RemoteLeaseLost, acquire, read_record
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.store import RemoteError, Store
from sc_app.checkpoint.remote.sync import bring_newer
from sc_app.checkpoint.remote.upload import upload_bundle
from tests.support.bundles import make_bundle, reseal, tree

LINEAGE = "lineage-test"


def _store(cfg: Any) -> Store:
    """The store as a run opens it: after the start-up probe (which also learns the server's If-Match form)."""
    return open_bucket(cfg, lineage=LINEAGE)[0]


def _upload(store: Store, bundle: Path, lease: fence.RemoteLease) -> upload.UploadResult:
    return upload_bundle(store, bundle, lease, hmac_key=None, deadline_s=120)


def _bring(store: Store, root: Path) -> Any:
    record, _ = read_record(store)
    return bring_newer(store, record, root, local_newest=lambda: None, lineage=LINEAGE, hmac_key=None, concurrency=4)


def _with_big_file(bundle: Path, mib: int) -> Path:
    """A bundle with a file of several parts (the manifest resealed over it): the upload goes multipart."""
    (bundle / "policy" / "big.bin").write_bytes(os.urandom(mib * 1024 * 1024))
    reseal(bundle)
    return bundle


def test_upload_publishes_then_resumes_into_an_empty_dir(s3_remote: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    bundle = _with_big_file(make_bundle(tmp_path / "a", 4, lineage=LINEAGE), 12)  # 12 MiB: three 5 MiB parts
    lease = acquire(store, "run-a", LINEAGE)
    result = _upload(store, bundle, lease)
    assert result.published and result.bytes > 12 * 1024 * 1024
    record, _ = read_record(store)
    assert record is not None and [b.step for b in record.bundles] == [4] and record.epoch == 1
    assert check(store, record.bundles[0], lineage=LINEAGE, hmac_key=None, digests=True).ok
    assert not _upload(store, bundle, lease).published  # listed already: nothing uploaded twice

    brought = _bring(store, tmp_path / "b")
    assert brought is not None and brought.path == tmp_path / "b" / "step_4"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["step_4"]  # no temporary dir left
    assert (brought.path / "policy" / "big.bin").read_bytes() == (bundle / "policy" / "big.bin").read_bytes()
    assert (brought.path / "manifest.json").read_bytes() == (bundle / "manifest.json").read_bytes()


def test_a_changed_object_never_resumes(s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    bundle = make_bundle(tmp_path / "a", 2, lineage=LINEAGE)
    lease = acquire(store, "run-a", LINEAGE)
    dir_ = _upload(store, bundle, lease).dir
    key = store.key(BUNDLES, dir_, "train_dataloader.pt")
    size = len((bundle / "train_dataloader.pt").read_bytes())
    rgw.client().put_object(Bucket=rgw.bucket, Key=key, Body=b"\0" * size)  # same size, other bytes
    record, _ = read_record(store)
    assert record is not None
    verdict = check(store, record.bundles[0], lineage=LINEAGE, hmac_key=None, digests=True)
    assert verdict.problems == ("train_dataloader.pt: its bytes on the server do not match the manifest's digest",)
    assert _bring(store, tmp_path / "b") is None  # the download refused it
    assert list((tmp_path / "b").iterdir()) == []  # and left nothing behind


def test_a_manifest_without_its_files_does_not_count(s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    lease = acquire(store, "run-a", LINEAGE)
    _upload(store, make_bundle(tmp_path / "a", 2, lineage=LINEAGE), lease)
    dir4 = _upload(store, make_bundle(tmp_path / "a", 4, lineage=LINEAGE), lease).dir
    rgw.client().delete_object(Bucket=rgw.bucket, Key=store.key(BUNDLES, dir4, "replay_buffer_metadata.pt"))
    record, _ = read_record(store)
    assert record is not None
    assert (
        "replay_buffer_metadata.pt: missing on the server"
        in check(store, record.newest_first()[0], lineage=LINEAGE, hmac_key=None, digests=False).problems
    )
    brought = _bring(store, tmp_path / "b")
    assert brought is not None and brought.step == 2 and len(brought.skipped) == 1  # the next older one
    assert verify_bundle(brought.path).ok


def test_a_multipart_upload_left_behind_is_no_bundle(s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    lease = acquire(store, "run-a", LINEAGE)
    key = store.key(BUNDLES, "step_9.zombie.e1", "policy/model.pt")
    c = rgw.client()
    mpu = c.create_multipart_upload(Bucket=rgw.bucket, Key=key)
    c.upload_part(Bucket=rgw.bucket, Key=key, UploadId=mpu["UploadId"], PartNumber=1, Body=b"x" * (5 << 20))
    _upload(store, make_bundle(tmp_path / "a", 3, lineage=LINEAGE), lease)
    record, _ = read_record(store)
    assert record is not None and [b.step for b in record.bundles] == [3]
    brought = _bring(store, tmp_path / "b")
    assert brought is not None and brought.step == 3


def test_server_killed_mid_upload_then_the_retry_publishes(s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store = _store(s3_remote.model_copy(update={"request_timeout_s": 3.0}))
    bundle = _with_big_file(make_bundle(tmp_path / "a", 5, lineage=LINEAGE), 60)
    lease = acquire(store, "run-a", LINEAGE)
    before = tree(bundle)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            _upload(store, bundle, lease)
        except BaseException as exc:
            failed.append(exc)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)  # parts in flight
    rgw.kill_gateway()
    t.join(timeout=120)
    try:
        assert not t.is_alive(), "the upload hung after the server died"
        assert failed and isinstance(failed[0], RemoteError), failed
        assert "\n" not in str(failed[0])
    finally:
        rgw.restart_gateway()
    record, _ = read_record(store)
    assert record is not None and record.bundles == ()  # never a bundle
    assert tree(bundle) == before  # the local bundle is only ever read
    assert _upload(store, bundle, lease).published  # the retry publishes
    record, _ = read_record(store)
    assert record is not None and [b.step for b in record.bundles] == [5]


def test_two_attempts_one_bucket_only_the_newest_publishes(
    s3_remote: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store_a, store_b = _store(s3_remote), _store(s3_remote)
    lease_a = acquire(store_a, "run-a", LINEAGE)
    bundle = make_bundle(tmp_path / "a", 6, lineage=LINEAGE)
    real_publish = upload.publish

    def b_takes_over_first(store: Store, lease: fence.RemoteLease, entry: Any) -> bool:
        acquire(store_b, "run-b", LINEAGE)  # between A's files + manifest and A's commit
        return real_publish(store, lease, entry)

    monkeypatch.setattr(upload, "publish", b_takes_over_first)
    with pytest.raises(RemoteLeaseLost, match="held by run run-b"):
        _upload(store_a, bundle, lease_a)
    monkeypatch.setattr(upload, "publish", real_publish)
    record, _ = read_record(store_a)
    assert record is not None and record.run_id == "run-b" and record.epoch == 2 and record.bundles == ()
    assert _bring(store_a, tmp_path / "b") is None  # A's uploaded files + manifest are no bundle
    with pytest.raises(RemoteLeaseLost):  # and A stays fenced off
        _upload(store_a, bundle, lease_a)
    lease_b = fence.RemoteLease("run-b", 2, LINEAGE)
    assert _upload(store_b, make_bundle(tmp_path / "b2", 6, lineage=LINEAGE), lease_b).published


def test_download_never_replaces_a_local_bundle(s3_remote: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    lease = acquire(store, "run-a", LINEAGE)
    _upload(store, make_bundle(tmp_path / "a", 7, lineage=LINEAGE), lease)
    record, _ = read_record(store)
    assert record is not None
    bundle = check(store, record.bundles[0], lineage=LINEAGE, hmac_key=None, digests=False)
    (tmp_path / "b" / "step_7").mkdir(parents=True)
    with pytest.raises(FileExistsError):
        download(store, bundle, tmp_path / "b", concurrency=2)
    assert list((tmp_path / "b").iterdir()) == [tmp_path / "b" / "step_7"]


def test_nothing_is_brought_when_the_local_dir_is_as_new(s3_remote: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    lease = acquire(store, "run-a", LINEAGE)
    _upload(store, make_bundle(tmp_path / "a", 4, lineage=LINEAGE), lease)
    record, _ = read_record(store)
    local = tmp_path / "b"
    make_bundle(local, 6, lineage=LINEAGE)
    asked: list[int] = []

    def newest() -> int:
        asked.append(1)
        return 6

    kw: dict[str, Any] = {"lineage": LINEAGE, "hmac_key": None, "concurrency": 2}
    assert bring_newer(store, record, local, local_newest=newest, **kw) is None
    assert asked and sorted(p.name for p in local.iterdir()) == ["step_6"]
    damaged = tmp_path / "c"
    make_bundle(damaged, 4, lineage=LINEAGE)
    (damaged / "step_4" / "train_dataloader.pt").write_bytes(b"torn")
    before = tree(damaged)
    assert bring_newer(store, record, damaged, local_newest=lambda: None, **kw) is None  # never over a local step_4
    assert tree(damaged) == before


def test_an_empty_dir_adopts_the_buckets_lineage_when_nothing_was_published(s3_remote: Any, tmp_path: Path) -> None:
    """An attempt took the bucket and died before its first upload; its successor on a fresh emptyDir takes the
    bucket again (the same lineage), instead of being refused as another job."""
    from sc_app.attempt.remote_tier import open_remote
    from sc_app.checkpoint.lineage import ensure_lineage
    from sc_app.config.app import AppConfig

    acquire(_store(s3_remote), "first", LINEAGE)
    cfg = AppConfig().model_copy(update={"checkpoint": AppConfig().checkpoint.model_copy(update={"remote": s3_remote})})
    tier = open_remote(cfg, tmp_path / "empty")
    assert tier is not None and tier.lineage() == LINEAGE
    (tmp_path / "empty").mkdir()  # the run made it (its lease) before
    lineage = ensure_lineage(tmp_path / "empty", adopt=tier.lineage())
    tier.start("second", lineage, None)
    try:
        record, _ = read_record(tier.store)
        assert record is not None and (record.run_id, record.epoch, record.lineage) == ("second", 2, LINEAGE)
    finally:
        tier.finish(wait=False)


def test_a_stalling_server_costs_a_bounded_time_and_publishes_nothing(s3_remote: Any, rgw: Any, tmp_path: Path) -> None:
    store = _store(s3_remote.model_copy(update={"request_timeout_s": 1.0}))
    bundle = make_bundle(tmp_path / "a", 3, lineage=LINEAGE)
    lease = acquire(store, "run-a", LINEAGE)
    rgw.pause_gateway(True)
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteError) as err:
            _upload(store, bundle, lease)
    finally:
        rgw.pause_gateway(False)
    assert time.monotonic() - t0 < 60, "5 attempts of 1 s requests and their backoff, not a hang"
    assert "\n" not in str(err.value)
    record, _ = read_record(store)
    assert record is not None and record.bundles == ()


def test_a_bundle_past_its_deadline_is_abandoned_and_never_published(s3_remote: Any, tmp_path: Path) -> None:
    store = _store(s3_remote)
    bundle = _with_big_file(make_bundle(tmp_path / "a", 3, lineage=LINEAGE), 30)
    lease = acquire(store, "run-a", LINEAGE)
    with pytest.raises(upload.DeadlineExceeded, match="passed its deadline"):
        upload_bundle(store, bundle, lease, hmac_key=None, deadline_s=0.05)
    record, _ = read_record(store)
    assert record is not None and record.bundles == ()


def test_a_runs_uploader_keeps_the_bucket_to_checkpoint_keep(s3_remote: Any, tmp_path: Path) -> None:
    from sc_app.checkpoint.remote.uploader import Uploader

    store = _store(s3_remote)
    lease = acquire(store, "run-a", LINEAGE)
    up = Uploader(store, lease, hmac_key=None, deadline_s=60, keep=2)
    try:
        for step in (2, 4, 6):
            up.submit(make_bundle(tmp_path, step, lineage=LINEAGE))
            assert up.drain(60)
    finally:
        up.stop()
    record, _ = read_record(store)
    assert record is not None and [b.step for b in record.newest_first()] == [6, 4]
    prefix = store.key(BUNDLES) + "/"
    dirs = {key[len(prefix) :].split("/", 1)[0] for key, _ in store.list(prefix)}
    assert dirs == {b.dir for b in record.bundles}, "step_2's objects are gone too (DeleteObjects)"


def test_a_server_down_while_bringing_home_stops_the_run_rather_than_resume_older(
    s3_remote: Any, rgw: Any, tmp_path: Path
) -> None:
    from sc_app.attempt.remote_tier import RemoteUnavailable, open_remote
    from sc_app.checkpoint import BundleRules
    from sc_app.config.app import AppConfig

    store = _store(s3_remote)
    _upload(store, make_bundle(tmp_path / "a", 4, lineage=LINEAGE), acquire(store, "run-a", LINEAGE))
    local = tmp_path / "b"
    make_bundle(local, 2, lineage=LINEAGE)  # older than the bucket's
    remote = s3_remote.model_copy(update={"request_timeout_s": 1.0})
    cfg = AppConfig().model_copy(update={"checkpoint": AppConfig().checkpoint.model_copy(update={"remote": remote})})
    tier = open_remote(cfg, local)
    assert tier is not None
    before = tree(local)
    rgw.kill_gateway()
    try:
        with pytest.raises(RemoteUnavailable, match="could not bring the bucket's newest bundle home") as err:
            tier.bring_home(BundleRules.of_dir(local))
    finally:
        rgw.restart_gateway()
    assert "\n" not in str(err.value)
    assert tree(local) == before and sorted(p.name for p in local.iterdir()) == ["step_2"]
    assert tier.bring_home(BundleRules.of_dir(local)) is not None  # the server back: step_4 comes home


def test_two_attempts_on_one_bucket_the_older_is_fenced_with_one_line(
    s3_remote: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two clusters, one bucket, at the tier's level: the newer attempt takes the bucket; the older one's next upload
    is refused (its objects never become a bundle), said in one line, and its end waits for nothing more."""
    import logging

    from sc_app.attempt.remote_tier import open_remote
    from sc_app.config.app import AppConfig

    cfg = AppConfig().model_copy(update={"checkpoint": AppConfig().checkpoint.model_copy(update={"remote": s3_remote})})
    older, newer = open_remote(cfg, tmp_path / "a"), open_remote(cfg, tmp_path / "b")
    assert older is not None and newer is not None
    older.start("older", LINEAGE, None)
    newer.start("newer", LINEAGE, None)
    caplog.set_level(logging.INFO)
    try:
        assert older.uploader is not None
        older.uploader.submit(make_bundle(tmp_path / "a", 2, lineage=LINEAGE))
        older.finish(wait=True)
    finally:
        newer.finish(wait=False)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "now held by run newer (epoch 2); this run (epoch 1) publishes nothing more" in lines[0]
    record, _ = read_record(newer.store)
    assert record is not None and record.bundles == () and (record.run_id, record.epoch) == ("newer", 2)


def test_what_the_fenced_attempt_published_after_the_first_look_comes_home_before_the_decision(
    s3_remote: Any, tmp_path: Path
) -> None:
    """B looks at the bucket (step_2 comes home), A publishes step_4 meanwhile, B takes the bucket: A is fenced and
    step_4 comes home too, so B resumes from the bucket's newest as it stays (not from step_2, which would fork)."""
    from sc_app.attempt.remote_tier import open_remote
    from sc_app.checkpoint import BundleRules
    from sc_app.config.app import AppConfig

    store = _store(s3_remote)
    a = acquire(store, "run-a", LINEAGE)
    _upload(store, make_bundle(tmp_path / "a", 2, lineage=LINEAGE), a)
    cfg = AppConfig().model_copy(update={"checkpoint": AppConfig().checkpoint.model_copy(update={"remote": s3_remote})})
    b = open_remote(cfg, tmp_path / "b")
    assert b is not None
    first = b.bring_home(BundleRules.of_dir(tmp_path / "b"))
    assert first is not None and first.step == 2
    _upload(store, make_bundle(tmp_path / "a", 4, lineage=LINEAGE), a)  # after B's look, before its take-over
    assert b.take("run-b", LINEAGE) is True
    again = b.bring_home(BundleRules.of_dir(tmp_path / "b"))
    assert again is not None and again.step == 4 and verify_bundle(again.path).ok
    with pytest.raises(RemoteLeaseLost):
        _upload(store, make_bundle(tmp_path / "a", 6, lineage=LINEAGE), a)
    assert b.take("run-b2", LINEAGE) is False  # nothing newer since: no second look needed
