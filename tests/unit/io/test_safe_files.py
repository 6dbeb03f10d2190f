"""io/safe_files.py: only regular files are opened, no link is followed, nothing outside the tree, bounded reads."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import pytest

from sc_app.io.safe_files import FileProblem, Tree, read_regular, unsafe_rel


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.json").write_bytes(b"{}")
    (tmp_path / "big").write_bytes(b"x" * 100)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "big")
    (tmp_path / "sub" / "escape").symlink_to("../big")
    return tmp_path


# Every kind of entry that is not a regular file, and how both readers name it. A FIFO must not block the test.
NOT_REGULAR = [
    ("missing", ": missing"),
    ("sub", ": is a directory, expected a regular file"),
    ("fifo", ": is a FIFO, not a regular file; not opened"),
    ("link", ": is a symbolic link (sc-app never writes one); not followed"),
]


@pytest.mark.parametrize(("rel", "said"), NOT_REGULAR, ids=[r for r, _ in NOT_REGULAR])
def test_tree_and_path_readers_refuse_what_is_not_a_regular_file(tree: Path, rel: str, said: str) -> None:
    with Tree.open(tree) as t, pytest.raises(FileProblem) as in_tree:
        t.read(rel, 1000)
    with pytest.raises(FileProblem) as by_path:
        read_regular(tree / rel, 1000)
    assert str(in_tree.value) == str(by_path.value) == f"{tree / rel}{said}"


def test_a_socket_is_named_and_never_opened(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(FileProblem, match="socket"):
            read_regular(tmp_path / "sock", 10)


def test_a_link_inside_the_tree_is_not_followed_even_to_a_file_inside(tree: Path) -> None:
    with Tree.open(tree) as t:
        with pytest.raises(FileProblem, match="link"):
            t.read("sub/escape", 1000)
        assert t.read("sub/a.json", 10) == b"{}"


@pytest.mark.parametrize("rel", ["/etc/passwd", "../x", "sub/../big", "", "./big", "sub//a.json"])
def test_paths_that_are_not_plain_and_relative_are_refused(tree: Path, rel: str) -> None:
    assert unsafe_rel(rel)
    with Tree.open(tree) as t, pytest.raises(FileProblem):
        t.read(rel, 1000)


def test_reads_are_bounded_and_hashes_read_once(tree: Path) -> None:
    with Tree.open(tree) as t:
        with pytest.raises(FileProblem, match="100 bytes, more than the 99 this file may hold"):
            t.read("big", 99)
        assert t.read("big", 100) == b"x" * 100
        assert t.sha256("big") == (hashlib.sha256(b"x" * 100).hexdigest(), 100)
    with pytest.raises(FileProblem):
        read_regular(tree / "big", 99)


def test_a_tree_that_is_a_link_or_a_file_is_refused(tree: Path) -> None:
    (tree / "dirlink").symlink_to(tree / "sub")
    for bad in ("dirlink", "big"):
        with pytest.raises(FileProblem):
            Tree.open(tree / bad)
