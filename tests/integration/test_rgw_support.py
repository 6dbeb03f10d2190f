"""The suite's S3 server (``tests/support/rgw.py``) does not depend on the host's disk: on a volume 96% full (a
tmpfs filled here) it starts and stores an object. Ceph's monitor refuses to start under 5% free by default, and
the OSD's mkfs then waited on it until its timeout: every S3 test of a worker errored when a shared disk filled."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.rgw import Rgw, skip_reason


@pytest.fixture
def full_volume(tmp_path: Path) -> Iterator[Path]:
    why = skip_reason() or (None if os.geteuid() == 0 else "mounting a tmpfs needs root")
    if why:
        pytest.skip(why)
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1000M", "tmpfs", str(mnt)], check=True)
    try:
        with open(mnt / "fill", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 960 * 2**20)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_s3_server_starts_on_a_volume_96_percent_full(full_volume: Path) -> None:
    usage = shutil.disk_usage(full_volume)
    assert usage.free / usage.total < 0.05, "the volume must be past Ceph's default refusal"
    server = Rgw(full_volume / "rgw").start(timeout=60)
    try:
        server.client().put_object(Bucket=server.bucket, Key="k", Body=b"x" * 1000)
        assert server.client().get_object(Bucket=server.bucket, Key="k")["Body"].read() == b"x" * 1000
    finally:
        server.stop()
