"""The attempt's side of the remote tier: what a bundle committed on the bucket alone (``checkpoint.remote.parts=
direct``) does to the uploader and the records shown, and when the controller is handed the link to commit there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sc_app.attempt.remote_tier import RemoteTier, RemoteUnavailable
from sc_app.checkpoint.remote.fence import RemoteLease
from sc_app.checkpoint.remote.store import RemoteError
from sc_app.config.app import load_config
from sc_app.progress import SaveRecord, UploadRecord

BUCKET = "checkpoint.remote.url=s3://my-bucket/jobs/x"


class _Uploader:
    def __init__(self) -> None:
        self.submitted: list[Path] = []

    def submit(self, bundle: Path) -> None:
        self.submitted.append(bundle)


class _Store:
    bare_if_match = True


def _tier(tmp_path: Path, *sets: str) -> tuple[RemoteTier, list[Any]]:
    shown: list[Any] = []
    tier = RemoteTier(load_config(None, [BUCKET, *sets]), tmp_path, _Store(), None)  # type: ignore[arg-type]
    tier.uploader = _Uploader()  # type: ignore[assignment]
    tier.shown = shown.append
    return tier, shown


def _saved(step: int, **kw: Any) -> SaveRecord:
    return SaveRecord(step, f"step_{step}", 2.0, 0.01, 0.01, 4, 1024, **kw)


def test_a_bundle_committed_on_the_bucket_is_counted_not_uploaded(tmp_path: Path) -> None:
    tier, shown = _tier(tmp_path, "checkpoint.volume=local", "checkpoint.remote.parts=direct")
    tier.progress(_saved(6, on_bucket=True, uploaded_bytes=5000))
    assert tier.uploader.submitted == [], "nothing of it is local: the uploader is not handed it"  # type: ignore[union-attr]
    assert tier.newest_remote == tier.newest_local == 6
    assert shown == [_saved(6, on_bucket=True, uploaded_bytes=5000), UploadRecord(6, "step_6", 5000, 2.0, 0)]


def test_a_local_bundle_still_goes_to_the_uploader(tmp_path: Path) -> None:
    tier, shown = _tier(tmp_path)
    tier.progress(_saved(4))
    assert tier.uploader.submitted == [tmp_path / "step_4"]  # type: ignore[union-attr]
    assert tier.newest_local == 4 and tier.newest_remote == 0 and shown == [_saved(4)]


def test_the_controller_gets_a_link_only_with_parts_direct_once_the_bucket_is_taken(tmp_path: Path) -> None:
    via_head, _ = _tier(tmp_path, "checkpoint.volume=local")
    direct, _ = _tier(tmp_path, "checkpoint.volume=local", "checkpoint.remote.parts=direct")
    assert direct.link() is None, "not before this attempt took the bucket"
    lease = RemoteLease("run-a", 3, "lineage")
    via_head.lease = direct.lease = lease
    assert via_head.link() is None
    link = direct.link()
    assert link is not None and link.lease == lease and link.bare_if_match is True


class _DownStore(_Store):
    def key(self, *parts: str) -> str:
        return "/".join(parts)

    def where(self, key: str) -> str:
        return f"s3://my-bucket/{key}"

    def get_small(self, key: str, limit: int) -> Any:
        raise RemoteError(f"{self.where(key)}: EndpointConnectionError: Could not connect to the endpoint URL")


def test_an_in_job_restore_that_cannot_read_the_bucket_ends_the_attempt_in_one_line(tmp_path: Path) -> None:
    tier, _ = _tier(tmp_path, "checkpoint.volume=local", "checkpoint.remote.parts=direct")
    tier.store = _DownStore()  # type: ignore[assignment]
    with pytest.raises(RemoteUnavailable) as info:
        tier.bring_newest_home(None, None)  # type: ignore[arg-type]  # (the record is read first)
    line = str(info.value)
    assert "\n" not in line and "an in-job restore could not read the bucket's record" in line, line
    assert "EndpointConnectionError" in line and "rerun to resume from the bucket's newest bundle" in line
