"""checkpoint.lease: one writer per checkpoint directory; a newer run fences every older one off; liveness by
heartbeat and release; a bounded record; a malformed LEASE is one clear error."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from sc_app.checkpoint.lease import (
    LEASE_FILE,
    CheckpointDirNotShared,
    Lease,
    LeaseError,
    LeaseKeeper,
    LeaseLost,
    live_holder,
    read_lease,
)


def test_first_lease_has_epoch_one_and_each_takeover_adds_one(tmp_path: Path) -> None:
    a = Lease.acquire(tmp_path, "run-a")
    assert a.fencing_epoch == 1
    a.check()
    b = Lease.acquire(tmp_path, "run-b")
    assert b.fencing_epoch == 2
    b.check()
    record = json.loads((tmp_path / LEASE_FILE).read_text())
    assert record["run_id"] == "run-b" and record["epoch"] == 2 and "fencing_epoch" not in record  # on-disk name


def test_an_older_holder_is_fenced_off(tmp_path: Path) -> None:
    a = Lease.acquire(tmp_path, "run-a")
    Lease.acquire(tmp_path, "run-b")
    with pytest.raises(LeaseLost, match="run-b"):
        a.check()
    with pytest.raises(LeaseLost), a.held():
        raise AssertionError("the body must not run for a fenced-off writer")


def test_the_same_run_id_with_an_older_epoch_is_fenced_too(tmp_path: Path) -> None:
    a = Lease.acquire(tmp_path, "same")
    Lease.acquire(tmp_path, "same")
    with pytest.raises(LeaseLost):
        a.check()


def test_no_lease_file_reads_as_none(tmp_path: Path) -> None:
    assert read_lease(tmp_path) is None


def test_heartbeat_release_and_expiry_decide_liveness(tmp_path: Path) -> None:
    lease = Lease.acquire(tmp_path, "run-a", ttl_s=10)
    record = read_lease(tmp_path)
    assert record is not None and record.live() and live_holder(tmp_path) == record
    assert not record.live(now=record.heartbeat_at + 11), "a heartbeat older than ttl_s has expired"
    before = record.heartbeat_at
    time.sleep(0.01)
    lease.renew()
    assert read_lease(tmp_path).heartbeat_at > before  # type: ignore[union-attr]
    assert lease.release("done", final_step=7, newest_bundle="step_7")
    released = read_lease(tmp_path)
    assert released is not None and not released.live() and live_holder(tmp_path) is None
    assert released.released is not None and released.released.outcome == "done"
    assert released.released.final_step == 7 and released.released.newest_bundle == "step_7"


def test_a_fenced_off_run_can_neither_renew_nor_release(tmp_path: Path) -> None:
    a = Lease.acquire(tmp_path, "run-a")
    Lease.acquire(tmp_path, "run-b")
    with pytest.raises(LeaseLost):
        a.renew()
    assert not a.release("failed")
    current = read_lease(tmp_path)
    assert current is not None and current.run_id == "run-b" and current.released is None


def test_the_record_stays_bounded_over_many_attempts(tmp_path: Path) -> None:
    sizes = []
    for n in range(200):
        lease = Lease.acquire(tmp_path, f"run-{n}")
        lease.release("stopped", final_step=n)
        sizes.append((tmp_path / LEASE_FILE).stat().st_size)
    record = read_lease(tmp_path)
    assert record is not None and record.fencing_epoch == 200
    assert record.previous is not None and record.previous["epoch"] == 199 and "previous" not in record.previous
    assert max(sizes[1:]) - min(sizes[1:]) < 32, "the record must not grow with the number of attempts"


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[1, 2]",
        b'{"run_id": "x"}',
        b'{"run_id": 1, "epoch": 1}',
        b"\xff\xfe",
        b"[" * 100000,
        b'{"run_id": "x", "epoch": true, "host": "h", "pid": 1, "acquired_at": "t", "heartbeat_at": 1, "ttl_s": 60}',
    ],
)
def test_a_malformed_lease_is_one_clear_error_everywhere(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LEASE_FILE).write_bytes(content)
    for attempt in (lambda: read_lease(tmp_path), lambda: Lease.acquire(tmp_path, "run-x")):
        with pytest.raises(LeaseError) as info:
            attempt()
        assert str(tmp_path / LEASE_FILE) in str(info.value) and "\n" not in str(info.value)
    assert (tmp_path / LEASE_FILE).read_bytes() == content, "a malformed lease is never overwritten"


def test_a_full_disk_leaves_no_partial_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        Lease.acquire(tmp_path, "run-a")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lease.lock"], "nothing half-written is left behind"


def test_the_keeper_renews_until_stopped_and_notices_a_takeover(tmp_path: Path) -> None:
    lease = Lease.acquire(tmp_path, "run-a", ttl_s=0.3)
    keeper = LeaseKeeper(lease, ttl_s=0.3)
    try:
        first = read_lease(tmp_path).heartbeat_at  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while read_lease(tmp_path).heartbeat_at == first and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.05)
        assert read_lease(tmp_path).heartbeat_at > first  # type: ignore[union-attr]
        Lease.acquire(tmp_path, "run-b", ttl_s=0.3)
        assert keeper.lost.wait(10), "a renewal after a takeover must notice it"
    finally:
        keeper.stop()
    assert read_lease(tmp_path).run_id == "run-b"  # type: ignore[union-attr]


def test_a_holder_process_that_is_gone_on_this_host_is_not_live(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(done.stdout)
    Lease.acquire(tmp_path, "run-a")
    doc = json.loads((tmp_path / LEASE_FILE).read_text())
    (tmp_path / LEASE_FILE).write_text(json.dumps({**doc, "pid": dead_pid}))
    assert live_holder(tmp_path) is None, "the heartbeat is fresh but the process is gone"
    (tmp_path / LEASE_FILE).write_text(json.dumps({**doc, "host": "another-pod"}))
    assert live_holder(tmp_path) is not None, "on another host only the heartbeat can tell"


def test_an_in_job_restore_fences_the_torn_down_job_and_keeps_the_run(tmp_path: Path) -> None:
    """``advance`` moves the same run one epoch on: a holder of the old ``Lease`` (a zombie of the torn-down job) can
    no longer pass a lease check — so never publish — while the keeper renews the new one."""
    lease = Lease.acquire(tmp_path, "run-a", ttl_s=0.3)
    keeper = LeaseKeeper(lease, ttl_s=0.3)
    try:
        zombie = keeper.lease
        fresh = keeper.advance()
        assert (fresh.run_id, fresh.fencing_epoch) == ("run-a", zombie.fencing_epoch + 1)
        with pytest.raises(LeaseLost):
            zombie.check()
        with pytest.raises(LeaseLost), zombie.held():
            pass
        fresh.check()
        renewed = read_lease(tmp_path).heartbeat_at  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while read_lease(tmp_path).heartbeat_at == renewed and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.05)
        assert not keeper.lost.is_set(), "the keeper renews the advanced lease, not the fenced one"
        assert read_lease(tmp_path).fencing_epoch == fresh.fencing_epoch  # type: ignore[union-attr]
    finally:
        keeper.stop()
    Lease.acquire(tmp_path, "run-b")
    with pytest.raises(LeaseLost):
        fresh.advance()  # a run that lost the lease cannot take it back by advancing


def test_a_process_on_a_node_without_the_checkpoint_dir_is_told_so_by_name_host_and_fix(tmp_path: Path) -> None:
    """``check_seen_by`` runs in a bundle writer's process: an empty directory at the lease's path is another disk
    (``CheckpointDirNotShared``, one line naming the process, the host and what to do), another run's lease is
    ``LeaseLost``, and it writes nothing."""
    lease = Lease.acquire(tmp_path / "shared", "run-a")
    lease.check_seen_by("trainer rank 1")  # the driver's node sees it

    elsewhere = Lease(tmp_path / "node-local", lease.run_id, lease.fencing_epoch)
    (tmp_path / "node-local").mkdir()
    with pytest.raises(CheckpointDirNotShared) as err:
        elsewhere.check_seen_by("trainer rank 1")
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"trainer rank 1 on host {socket.gethostname()} does not see")
    assert str(tmp_path / "node-local" / LEASE_FILE) in line and "Without a shared volume" in line
    assert list((tmp_path / "node-local").iterdir()) == [], "a check never writes"

    Lease.acquire(tmp_path / "shared", "run-b")
    with pytest.raises(LeaseLost):
        lease.check_seen_by("the controller actor")
