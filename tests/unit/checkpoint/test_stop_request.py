"""checkpoint.stop_request: a stop request reaches exactly the lease it names; stale or foreign files are inert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_app.checkpoint.lease import Lease, read_lease
from sc_app.checkpoint.stop_request import STOP_FILE, StopWatch, read_stop_request, request_stop


def test_a_request_is_addressed_to_the_current_holder(tmp_path: Path) -> None:
    lease = Lease.acquire(tmp_path, "run-a")
    holder = read_lease(tmp_path)
    assert holder is not None
    request = request_stop(tmp_path, holder)
    assert request.addressed_to("run-a", lease.fencing_epoch)
    assert StopWatch(tmp_path, "run-a", lease.fencing_epoch, period=0).requested() == request
    on_disk = json.loads((tmp_path / STOP_FILE).read_text())
    assert on_disk["epoch"] == lease.fencing_epoch and "fencing_epoch" not in on_disk, "the file keeps its field name"


def test_a_request_left_for_an_earlier_attempt_never_stops_a_retry(tmp_path: Path) -> None:
    Lease.acquire(tmp_path, "run-a")
    request_stop(tmp_path, read_lease(tmp_path))  # type: ignore[arg-type]
    retry = Lease.acquire(tmp_path, "run-b")
    assert StopWatch(tmp_path, "run-b", retry.fencing_epoch, period=0).requested() is None
    same_id_later_epoch = Lease.acquire(tmp_path, "run-a")
    assert StopWatch(tmp_path, "run-a", same_id_later_epoch.fencing_epoch, period=0).requested() is None


@pytest.mark.parametrize("content", [b"", b"{", b"[]", b'{"run_id": "a"}', b"\xff" * 10, b"x" * 100_000])
def test_a_malformed_request_is_ignored(tmp_path: Path, content: bytes) -> None:
    (tmp_path / STOP_FILE).write_bytes(content)
    assert read_stop_request(tmp_path) is None


def test_a_directory_named_stop_is_ignored(tmp_path: Path) -> None:
    (tmp_path / STOP_FILE).mkdir()
    assert read_stop_request(tmp_path) is None


def test_the_watch_polls_at_most_once_per_period(tmp_path: Path) -> None:
    lease = Lease.acquire(tmp_path, "run-a")
    watch = StopWatch(tmp_path, "run-a", lease.fencing_epoch, period=3600)
    assert watch.requested() is None
    request_stop(tmp_path, read_lease(tmp_path))  # type: ignore[arg-type]
    assert watch.requested() is None, "not read again within the period"
    assert StopWatch(tmp_path, "run-a", lease.fencing_epoch, period=3600).requested() is not None


def test_a_request_reaches_a_run_whose_epoch_an_in_job_restore_moved_on(tmp_path: Path) -> None:
    first = Lease.acquire(tmp_path, "run-a")
    watch = StopWatch(tmp_path, "run-a", first.fencing_epoch, period=0)
    first.advance()
    request = request_stop(tmp_path, read_lease(tmp_path))  # type: ignore[arg-type]
    assert request.fencing_epoch == first.fencing_epoch + 1
    assert watch.requested() == request
