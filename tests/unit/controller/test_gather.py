"""A save with ``checkpoint.volume: local`` in process: a rank whose node has a disk of its own stages its part
there and the controller gathers it into the bundle it commits (``sc_app.controller.gather``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import node_parts
from sc_app.checkpoint.manifest import read_manifest
from sc_app.io import hashing
from sc_app.progress import SaveFailedRecord, SaveRecord
from tests.unit.controller.harness import make_controller, run


def _run_with_own_disk(tmp_path: Path, big: int = 0) -> tuple[Any, Path]:
    controller, _ = make_controller(tmp_path, max_steps=2, save_period=2, trainers=2)
    away = controller.args.trainers[1]
    away.own_disk = tmp_path / "node1" / ".node_parts" / "rank_1" / "save"
    away.big = big

    async def body() -> Any:
        await controller.restore()
        return await controller.run()

    run(body())
    return controller, away.own_disk


@pytest.mark.parametrize("chunk", [16, 9])  # 9: the unhashed file (27 bytes) ends exactly on a chunk's end
def test_a_part_staged_on_a_nodes_own_disk_is_gathered_into_the_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    monkeypatch.setattr(node_parts, "CHUNK", chunk)
    controller, own_disk = _run_with_own_disk(tmp_path, big=27)
    assert [r.step for r in controller.progress(0) if isinstance(r, SaveRecord)] == [2]
    bundle = tmp_path / "ckpt" / "step_2"
    assert (bundle / "policy" / "rank0.bin").read_bytes() == b"rank 0 version 2"
    assert (bundle / "policy" / "rank1.bin").read_bytes() == b"rank 1 version 2", "the staged part is in the bundle"
    assert (bundle / "policy" / "sub" / "unhashed1").read_bytes() == b"x" * 27, "a file its writer did not hash too"
    manifest = read_manifest(bundle, hmac_key=None)
    listed = {rel: entry for rel, entry in manifest.files.items() if rel.startswith("policy/")}
    assert set(listed) == {"policy/rank0.bin", "policy/rank1.bin", "policy/sub/unhashed1", "policy/sub/empty1"}
    assert (bundle / "policy" / "sub" / "empty1").read_bytes() == b""
    for rel, entry in listed.items():  # the manifest lists each gathered file with the digest of its bytes
        assert hashing.digest_file(bundle / rel, manifest.hash_alg).digest == entry["digest"]
    reads = [args for args in controller.args.trainers[1].called("read_part") if args[0] == "sub/unhashed1"]
    assert [offset for _, offset in reads] == list(range(0, 27, chunk)), "each chunk read once, none past the end"
    assert controller.args.trainers[1].called("drop_part") == [None] and not own_disk.exists(), "the node's disk freed"
    assert controller.args.trainers[0].called("read_part") == [], "a rank that sees the directory is not gathered"


def test_a_staged_part_whose_bytes_changed_fails_the_save_and_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = node_parts.read_chunk

    def flipped(directory: Path, rel: str, offset: int) -> bytes:
        data = real(directory, rel, offset)
        return data.replace(b"version", b"VERSION") if rel == "rank1.bin" else data

    monkeypatch.setattr(node_parts, "read_chunk", flipped)
    controller, own_disk = _run_with_own_disk(tmp_path)
    (failed,) = [r for r in controller.progress(0) if isinstance(r, SaveFailedRecord)]
    assert "rank1.bin" in failed.error and "differ from the" in failed.error and "\n" not in failed.error
    assert not list((tmp_path / "ckpt").glob("*step_*")), "no bundle and no tmp dir is left behind"
    assert not own_disk.exists(), "the staged part is dropped after a failed save too"


def test_a_staged_file_that_shrank_fails_the_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = node_parts.read_chunk

    def short(directory: Path, rel: str, offset: int) -> bytes:
        return real(directory, rel, offset)[:-1] if rel == "sub/unhashed1" else real(directory, rel, offset)

    monkeypatch.setattr(node_parts, "read_chunk", short)
    controller, own_disk = _run_with_own_disk(tmp_path)
    (failed,) = [r for r in controller.progress(0) if isinstance(r, SaveFailedRecord)]
    assert "unhashed1: fake-host staged 3 bytes, 2 read" in failed.error, failed.error
    assert not list((tmp_path / "ckpt").glob("*step_*")) and not own_disk.exists()
