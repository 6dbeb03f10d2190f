"""Bundles committed on the bucket alone, a rank uploading its own part (``checkpoint.remote.parts=direct``,
``sc_app.checkpoint.remote.parts``), against the suite's real S3 server: the part goes up hashed as sent, the sealed
tmp dir is published around it, and such a bundle counts, verifies and comes home like any other; a part whose
bytes differ from its writer's hash, an object changed on the server, and an abandoned save never publish.
No Ray: the tmp dir is filled by hand as the controller fills it (``tests/support/bundles.py``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.node_parts import PartMismatch, list_files
from sc_app.checkpoint.remote.bundles import check
from sc_app.checkpoint.remote.fence import BUNDLES, acquire, read_record
from sc_app.checkpoint.remote.parts import PartTarget, RemoteLink, commit_on_bucket, save_dir, upload_part
from sc_app.checkpoint.remote.probe import open_bucket
from sc_app.checkpoint.remote.store import RemoteError, Store
from sc_app.checkpoint.remote.sync import bring_newer
from sc_app.checkpoint.writer import BundleWriter, SaveAbandoned
from sc_app.io import hashing
from tests.support.bundles import write_contents

LINEAGE = "lineage-parts"


def _open(cfg: Any, run: str = "run-a") -> tuple[Store, RemoteLink]:
    store = open_bucket(cfg, lineage=LINEAGE)[0]
    return store, RemoteLink(acquire(store, run, LINEAGE), store.bare_if_match)


def _save(
    root: Path, rank_disk: Path, step: int, lease: Lease | None = None
) -> tuple[BundleWriter, dict[str, Any], dict[str, int]]:
    """A tmp dir as the controller leaves it, its ``policy/`` moved onto a rank's own disk: the writer, the manifest
    record and the rank's staged files (name → size)."""
    writer = BundleWriter(root, step, lease=lease).begin()
    record = write_contents(writer, step, lineage=LINEAGE)
    rank_disk.mkdir(parents=True)
    for f in list(writer.policy_dir.iterdir()):
        shutil.move(f, rank_disk / f.name)
    return writer, record, list_files(rank_disk)


def _publish(store: Store, link: RemoteLink, writer: BundleWriter, record: dict[str, Any], sent: dict) -> Any:
    uploaded = {f"policy/{rel}": rec for rel, rec in sent.items()}
    return commit_on_bucket(store, writer, record, {}, uploaded, link=link, hmac_key=None, deadline_s=120)


def test_a_bundle_with_a_ranks_own_upload_counts_verifies_and_comes_home(s3_remote: Any, tmp_path: Path) -> None:
    store, link = _open(s3_remote)
    writer, record, staged = _save(tmp_path / "head", tmp_path / "rank1", 4)
    hashed = {"model.pt": hashing.digest_file(tmp_path / "rank1" / "model.pt", hashing.DEFAULT)}  # the rest: not
    sent = upload_part(store, tmp_path / "rank1", staged, hashed, PartTarget(link, save_dir(link, writer), 120))
    assert sorted(sent) == ["model.pt", "optimizer.pt"]
    result = _publish(store, link, writer, record, sent)
    assert result.published and result.bytes < 1024 * 1024, "the head uploaded its own files only"
    assert sorted(os.listdir(tmp_path / "head")) == [], "no step_N renamed locally, the sealed tmp dir gone"

    published, _ = read_record(store)
    assert published is not None and [b.step for b in published.bundles] == [4]
    assert check(store, published.bundles[0], lineage=LINEAGE, hmac_key=None, digests=True).ok
    home = bring_newer(store, published, tmp_path / "new", local_newest=lambda: None, lineage=LINEAGE,
                       hmac_key=None, concurrency=4)  # fmt: skip
    assert home is not None
    report = verify_bundle(home.path)
    assert report.ok, report.problems
    for name in ("model.pt", "optimizer.pt"):
        assert (home.path / "policy" / name).read_bytes() == (tmp_path / "rank1" / name).read_bytes()


def test_a_big_part_goes_up_in_parts_and_its_object_carries_its_digest(s3_remote: Any, tmp_path: Path) -> None:
    store, link = _open(s3_remote)
    (tmp_path / "rank").mkdir()
    (tmp_path / "rank" / "shard.distcp").write_bytes(os.urandom(12 * 1024 * 1024))  # three 5 MiB parts
    target = PartTarget(link, "step_2.run-a.e1.f0", 120)
    sent = upload_part(store, tmp_path / "rank", list_files(tmp_path / "rank"), {}, target)
    head = store.head(f"{target.prefix(store)}/shard.distcp")
    assert head.size == 12 * 1024 * 1024 and "-" in head.etag, "a multipart upload"
    assert head.digest == hashing.label(sent["shard.distcp"].alg, sent["shard.distcp"].digest)


def test_a_part_whose_bytes_are_not_its_writers_is_refused(s3_remote: Any, tmp_path: Path) -> None:
    store, link = _open(s3_remote)
    writer, _, staged = _save(tmp_path / "head", tmp_path / "rank1", 2)
    hashed = {"model.pt": hashing.digest_file(tmp_path / "rank1" / "model.pt", hashing.DEFAULT)}
    (tmp_path / "rank1" / "model.pt").write_bytes(b"x" * hashed["model.pt"].size)  # changed after its hash
    with pytest.raises(PartMismatch, match=r"model.pt: the .* bytes uploaded differ"):
        upload_part(store, tmp_path / "rank1", staged, hashed, PartTarget(link, save_dir(link, writer), 120))
    published, _ = read_record(store)
    assert published is not None and published.bundles == ()
    writer.abort()


def test_an_object_changed_on_the_server_before_the_commit_is_never_published(
    s3_remote: Any, rgw: Any, tmp_path: Path
) -> None:
    store, link = _open(s3_remote)
    writer, record, staged = _save(tmp_path / "head", tmp_path / "rank1", 6)
    sent = upload_part(store, tmp_path / "rank1", staged, {}, PartTarget(link, save_dir(link, writer), 120))
    key = f"{PartTarget(link, save_dir(link, writer), 120).prefix(store)}/model.pt"
    rgw.client().put_object(Bucket=rgw.bucket, Key=key, Body=b"\0" * sent["model.pt"].size)  # same size, no digest
    with pytest.raises(RemoteError, match="not the bytes its writer uploaded"):
        _publish(store, link, writer, record, sent)
    published, _ = read_record(store)
    assert published is not None and published.bundles == ()
    assert key.startswith(store.key(BUNDLES)), "the objects stay where no record names them: never a bundle"


def test_an_abandoned_save_is_never_published_on_the_bucket(s3_remote: Any, tmp_path: Path) -> None:
    store, link = _open(s3_remote)
    writer, record, staged = _save(tmp_path / "head", tmp_path / "rank1", 8)
    sent = upload_part(store, tmp_path / "rank1", staged, {}, PartTarget(link, save_dir(link, writer), 120))
    assert writer.abandon()
    with pytest.raises(SaveAbandoned):
        _publish(store, link, writer, record, sent)
    published, _ = read_record(store)
    assert published is not None and published.bundles == ()
    assert writer.tmp.is_dir(), "left for the next holder's tidy, as an abandoned local save"


def test_a_fenced_attempts_commit_never_publishes(s3_remote: Any, tmp_path: Path) -> None:
    store, old = _open(s3_remote, "run-old")
    writer, record, staged = _save(tmp_path / "head", tmp_path / "rank1", 10)
    sent = upload_part(store, tmp_path / "rank1", staged, {}, PartTarget(old, save_dir(old, writer), 120))
    acquire(store, "run-new", LINEAGE)  # another cluster took the bucket meanwhile
    from sc_app.checkpoint.remote.fence import RemoteLeaseLost

    with pytest.raises(RemoteLeaseLost):
        _publish(store, old, writer, record, sent)
    published, _ = read_record(store)
    assert published is not None and published.bundles == () and published.run_id == "run-new"


def test_a_step_redone_after_an_in_job_restore_never_writes_over_the_published_one(
    s3_remote: Any, tmp_path: Path
) -> None:
    store, link = _open(s3_remote)
    (tmp_path / "head").mkdir()
    lease = Lease.acquire(tmp_path / "head", "run-a")
    first, record, staged = _save(tmp_path / "head", tmp_path / "rank1", 6, lease)
    sent = upload_part(store, tmp_path / "rank1", staged, {}, PartTarget(link, save_dir(link, first), 120))
    assert _publish(store, link, first, record, sent).published
    # an in-job restore to an older bundle (epoch + 1), then the same step saved again by the same attempt
    again, record, staged = _save(tmp_path / "head", tmp_path / "rank1-again", 6, lease.advance())
    (tmp_path / "rank1-again" / "model.pt").write_bytes(b"other weights")
    sent = upload_part(store, tmp_path / "rank1-again", list_files(tmp_path / "rank1-again"), {},
                       PartTarget(link, save_dir(link, again), 120))  # fmt: skip
    assert save_dir(link, again) != save_dir(link, first)
    assert not _publish(store, link, again, record, sent).published, "the record lists step 6 already"
    published, _ = read_record(store)
    assert published is not None and [b.dir for b in published.bundles] == [save_dir(link, first)]
    assert check(store, published.bundles[0], lineage=LINEAGE, hmac_key=None, digests=True).ok
