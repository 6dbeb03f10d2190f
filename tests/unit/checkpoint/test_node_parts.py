"""The pure pieces of a bundle's parts on a node's own disk (``sc_app.checkpoint.node_parts``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sc_app.checkpoint import node_parts
from sc_app.checkpoint.node_parts import NodeCopyFailed, PartFile, PartMismatch, check_copy, list_files, read_chunk
from sc_app.io import hashing


def test_saves_stage_per_rank_and_restores_land_per_node_under_a_name_no_bundle_has(tmp_path: Path) -> None:
    from sc_app.checkpoint.layout import parse_step, parse_tmp

    save, restore = node_parts.part_dir(tmp_path, 1), node_parts.restore_dir(tmp_path)
    assert save != node_parts.part_dir(tmp_path, 0), "two ranks of one node stage apart"
    assert not save.is_relative_to(restore) and not restore.is_relative_to(save)
    for d in (save, restore):
        top = d.relative_to(tmp_path).parts[0]
        assert parse_step(top) is None and parse_tmp(top) is None


def test_a_part_file_is_hashed_as_written_and_refused_when_it_differs_from_its_writers_record(tmp_path: Path) -> None:
    data = b"abc" * 1000
    record = hashing.FileDigest(hashing.BLAKE3, hashing.digest_bytes(data, hashing.BLAKE3), len(data))
    f = PartFile(tmp_path, "sub/a.bin", hashing.BLAKE3)
    f.write(data[:10])
    f.write(data[10:])
    assert f.close(record) == record and (tmp_path / "sub/a.bin").read_bytes() == data
    g = PartFile(tmp_path, "b.bin", hashing.BLAKE3)
    g.write(data[:-1] + b"X")
    with pytest.raises(PartMismatch, match="differ from the 3000 its writer hashed"):
        g.close(record)
    with pytest.raises(FileExistsError):
        PartFile(tmp_path, "b.bin", hashing.BLAKE3)  # never over a file already there


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "a/./b", ""])
def test_names_outside_the_part_are_refused(tmp_path: Path, rel: str) -> None:
    with pytest.raises(PartMismatch, match="part file name"):
        read_chunk(tmp_path, rel, 0)
    with pytest.raises(PartMismatch, match="part file name"):
        PartFile(tmp_path, rel, hashing.BLAKE3)


def test_chunks_cover_a_file_and_only_the_last_is_short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_parts, "CHUNK", 4)
    (tmp_path / "f").write_bytes(b"0123456789")
    assert [read_chunk(tmp_path, "f", o) for o in (0, 4, 8, 12)] == [b"0123", b"4567", b"89", b""]


def test_listing_refuses_links_and_names_every_file(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_bytes(b"12")
    (tmp_path / "y").write_bytes(b"")
    assert list_files(tmp_path) == {"d/x": 2, "y": 0}
    os.symlink("/etc/passwd", tmp_path / "link")
    with pytest.raises(PartMismatch, match="link"):
        list_files(tmp_path)


def test_a_copy_sent_to_a_node_is_checked_against_the_manifests_digests(tmp_path: Path) -> None:
    (tmp_path / "m.pt").write_bytes(b"model")
    expected = {"m.pt": hashing.label(hashing.BLAKE3, hashing.digest_bytes(b"model", hashing.BLAKE3))}
    check_copy(tmp_path, expected)
    legacy = {"m.pt": hashing.digest_bytes(b"model", hashing.SHA256)}  # schema-1 bundles: a bare sha256
    check_copy(tmp_path, legacy)
    with pytest.raises(NodeCopyFailed, match="missing from the copy"):
        check_copy(tmp_path, {**expected, "o.pt": expected["m.pt"]})
    (tmp_path / "extra").write_bytes(b"")
    with pytest.raises(NodeCopyFailed, match="not a file of the bundle's policy/"):
        check_copy(tmp_path, expected)
    (tmp_path / "extra").unlink()
    (tmp_path / "m.pt").write_bytes(b"modeL")
    with pytest.raises(NodeCopyFailed, match="differs from the bundle's file"):
        check_copy(tmp_path, expected)
    with pytest.raises(NodeCopyFailed, match="cannot be read back"):
        check_copy(tmp_path / "gone", expected)


def test_chunks_received_in_any_order_make_the_file_the_copy_check_accepts(tmp_path: Path) -> None:
    data = b"0123456789"
    for offset in (8, 0, 4):
        node_parts.write_at(tmp_path, "d/f", offset, data[offset : offset + 4])
    assert (tmp_path / "d" / "f").read_bytes() == data
    check_copy(tmp_path, {"d/f": hashing.label(hashing.BLAKE3, hashing.digest_bytes(data, hashing.BLAKE3))})
    with pytest.raises(PartMismatch, match="part file name"):
        node_parts.write_at(tmp_path, "../escape", 0, b"x")
    assert not (tmp_path.parent / "escape").exists()


def test_a_restore_sends_each_node_one_copy_through_its_lowest_rank_and_none_where_the_directory_is() -> None:
    from sc_app.checkpoint.node_parts import DirView, away_by_node

    head, a, b = DirView(True, "head"), DirView(False, "a"), DirView(False, "b")
    views = [head, a, b, a, head]
    assert away_by_node(views) == {"a": [1, 3], "b": [2]}
    assert away_by_node([head] * 3) == {}


def test_a_copy_received_in_chunks_replaces_the_last_and_a_disk_that_cannot_take_it_is_one_clear_error(
    tmp_path: Path,
) -> None:
    node_parts.receive(tmp_path, "step_2", "old.pt", 0, b"stale")
    node_parts.receive(tmp_path, "step_4", "m.pt", 3, b"def", first=True)  # chunks arrive at their offsets
    node_parts.receive(tmp_path, "step_4", "m.pt", 0, b"abc")
    restore = node_parts.restore_dir(tmp_path)
    assert list_files(restore) == {"step_4/m.pt": 6} and (restore / "step_4/m.pt").read_bytes() == b"abcdef"
    (restore / "step_4" / "sub").write_bytes(b"")  # a file where a directory must go: the disk refuses (OSError)
    with pytest.raises(NodeCopyFailed, match=r"sub/o.pt on \S+: .+needs room there for one copy of a bundle's"):
        node_parts.receive(tmp_path, "step_4", "sub/o.pt", 0, b"x")
