"""checkpoint.lease: one writer per checkpoint directory; a newer run fences every older one off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sc_app.checkpoint.lease import LEASE_FILE, Lease, LeaseLost, read_lease


def test_first_lease_has_epoch_one_and_each_takeover_adds_one(tmp_path: Path) -> None:
    a = Lease.acquire(tmp_path, "run-a")
    assert a.epoch == 1
    a.check()
    b = Lease.acquire(tmp_path, "run-b")
    assert b.epoch == 2
    b.check()
    record = json.loads((tmp_path / LEASE_FILE).read_text())
    assert record["run_id"] == "run-b" and record["epoch"] == 2


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
