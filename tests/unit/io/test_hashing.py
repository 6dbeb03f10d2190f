"""sc_app.io.hashing: one algorithm name -> one digest, the same whichever way the bytes arrive (whole, in chunks,
through a file, through ``HashingWriter``'s write pass), and labelled digests that cannot be checked by the wrong
algorithm."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import blake3
import pytest
import torch

from sc_app.io import hashing, torch_files

DATA = os.urandom(3 * hashing.CHUNK + 12345)  # spans several chunks, ends mid-chunk
REFERENCE = {"sha256": hashlib.sha256(DATA).hexdigest(), "blake3": blake3.blake3(DATA).hexdigest()}


@pytest.mark.parametrize("alg", hashing.ALGORITHMS)
def test_every_way_of_hashing_gives_the_reference_digest(tmp_path: Path, alg: str) -> None:
    assert hashing.digest_bytes(DATA, alg) == REFERENCE[alg]
    p = tmp_path / "f"
    p.write_bytes(DATA)
    assert hashing.digest_file(p, alg) == hashing.FileDigest(alg, REFERENCE[alg], len(DATA))
    assert hashing.digest_file(p, alg, fsync=True).digest == REFERENCE[alg]
    with open(tmp_path / "w", "wb", buffering=0) as raw:
        out = hashing.HashingWriter(raw, alg)
        out.write(DATA[:100])
        out.write(memoryview(DATA)[100:])  # a view: written and hashed without a copy
    assert out.result() == hashing.FileDigest(alg, REFERENCE[alg], len(DATA))
    assert (tmp_path / "w").read_bytes() == DATA


def test_the_default_is_blake3_and_the_legacy_sha256() -> None:
    assert (hashing.DEFAULT, hashing.LEGACY) == ("blake3", "sha256")
    assert REFERENCE["blake3"] != REFERENCE["sha256"]


def test_a_tensor_view_is_hashed_as_its_bytes(tmp_path: Path) -> None:
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    with open(tmp_path / "t", "wb", buffering=0) as raw:
        out = hashing.HashingWriter(raw)
        out.write(memoryview(t.view(torch.uint8).numpy()))
    assert out.result().digest == blake3.blake3(t.numpy().tobytes()).hexdigest()


def test_torch_io_save_returns_the_digest_of_the_file_it_wrote(tmp_path: Path) -> None:
    got = torch_files.save({"w": torch.ones(4096)}, tmp_path / "x.pt")
    assert got == hashing.digest_file(tmp_path / "x.pt", "blake3")
    assert got.size == (tmp_path / "x.pt").stat().st_size
    assert torch_files.save({"w": 1}, tmp_path / "y.pt", hash_alg="sha256").alg == "sha256"
    assert torch.equal(torch_files.load(tmp_path / "x.pt")["w"], torch.ones(4096)), "written without zip CRCs, loads"
    from torch.utils.serialization import config

    assert config.save.compute_crc32, "torch's own setting is restored after the save"


def test_labels_carry_the_algorithm_and_a_bare_digest_is_sha256() -> None:
    labelled = hashing.label("blake3", REFERENCE["blake3"])
    assert labelled == "blake3:" + REFERENCE["blake3"]
    assert hashing.bytes_match(DATA, labelled)
    assert hashing.bytes_match(DATA, REFERENCE["sha256"])  # handed over bare: sha256, as before
    assert not hashing.bytes_match(DATA, "sha256:" + REFERENCE["blake3"]), "a digest checked by its own alg only"
    assert not hashing.bytes_match(DATA + b"x", labelled)
    assert not hashing.bytes_match(DATA, None) and not hashing.bytes_match(DATA, "")


@pytest.mark.parametrize("bad", ["md5", "SHA256", "", "blake2b"])
def test_an_unknown_algorithm_is_refused_by_name(bad: str) -> None:
    with pytest.raises(hashing.UnknownAlgorithm, match="unknown file hash algorithm"):
        hashing.new(bad)
    with pytest.raises(hashing.UnknownAlgorithm):
        hashing.split_label(f"{bad}:00") if bad else hashing.label(bad, "00")


def test_file_digest_round_trips_as_plain_data() -> None:
    d = hashing.FileDigest("blake3", "ab" * 32, 7)
    assert hashing.FileDigest.from_dict(d.as_dict()) == d
    with pytest.raises(hashing.UnknownAlgorithm):
        hashing.FileDigest.from_dict({**d.as_dict(), "alg": "md5"})
