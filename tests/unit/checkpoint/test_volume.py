"""checkpoint.volume: a checkpoint dir that cannot be used is one line, found before anything runs, on real files
and real mounts (a read-only and a full tmpfs)."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sc_app.checkpoint.volume import unusable_as_dir, unwritable


def test_a_usable_dir_passes_and_the_probe_leaves_nothing(tmp_path: Path) -> None:
    assert unwritable(tmp_path / "new" / "dir") is None
    assert (tmp_path / "new" / "dir").is_dir() and list((tmp_path / "new" / "dir").iterdir()) == []


def _fifo(p: Path) -> None:
    os.mkfifo(p)


def _socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    s.close()


def _link_to_file(p: Path) -> None:
    target = p.with_name("target")
    target.write_text("x")
    p.symlink_to(target)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p.write_text("x"), "a regular file"),
        (_fifo, "a named pipe"),
        (_socket, "a socket"),
        (_link_to_file, "symbolic link"),
    ],
)
def test_not_a_directory_is_named(tmp_path: Path, make: object, needle: str) -> None:
    root = tmp_path / "ckpt"
    make(root)  # type: ignore[operator]
    for check in (unusable_as_dir, unwritable):
        problem = check(root)
        assert problem is not None and needle in problem and str(root) in problem


def _mount_tmpfs(path: Path, *options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)]).returncode == 0


@pytest.fixture
def mounts(tmp_path: Path) -> Iterator[list[Path]]:
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only / full tmpfs needs root (the CI machine runs as root)")
    made: list[Path] = []
    yield made
    for m in made:
        subprocess.run(["umount", "-l", str(m)], check=False)


def test_a_read_only_volume_is_named(tmp_path: Path, mounts: list[Path]) -> None:
    ro = tmp_path / "ro"
    assert _mount_tmpfs(ro, "ro", "size=1m")
    mounts.append(ro)
    problem = unwritable(ro)
    assert problem is not None and "Read-only file system" in problem
    problem = unwritable(ro / "sub")
    assert problem is not None and "cannot be created" in problem


def test_a_full_volume_is_named_and_left_as_it_was(tmp_path: Path, mounts: list[Path]) -> None:
    full = tmp_path / "full"
    assert _mount_tmpfs(full, "size=64k")
    mounts.append(full)
    (full / "filler").write_bytes(b"\0" * (64 * 1024))  # tmpfs stops this at its size
    before = sorted(p.name for p in full.iterdir())
    problem = unwritable(full)
    assert problem is not None and "No space left on device" in problem
    assert sorted(p.name for p in full.iterdir()) == before, "the probe leaves nothing behind"
