"""checkpoint.writer: tmp_step_N → fsync → manifest last → rename; never overwrite, never delete."""

from __future__ import annotations

import json
from pathlib import Path

import blake3
import pytest
import torch

from sc_app.checkpoint import BundleExistsError, BundleWriter, layout, verify_bundle
from tests.support.bundles import make_bundle, make_tmp_leftover, tree, write_contents


def test_writer_builds_under_tmp_then_renames(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path, 4).begin()
    assert w.tmp == tmp_path / "tmp_step_4" and w.tmp.is_dir()
    fields = write_contents(w, 4)
    assert not (tmp_path / "step_4").exists(), "step_N must not exist before the rename"
    assert layout.step_dirs(tmp_path) == []
    inside = tree(w.tmp)
    final = w.commit(fields)
    assert final == tmp_path / "step_4" and final.is_dir()
    assert not w.tmp.exists()
    after = tree(final)
    assert {k: v for k, v in after.items() if k != "manifest.json"} == inside
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["step"] == 4
    assert set(manifest["files"]) == set(inside), "manifest must list every file except itself"
    for rel, info in manifest["files"].items():
        data = (final / rel).read_bytes()
        assert info == {"digest": blake3.blake3(data).hexdigest(), "size": len(data)}
    assert manifest["hash_alg"] == "blake3" and manifest["schema_version"] == 2
    assert manifest["replay"]["digest"] == torch.load(final / layout.SIDECAR_FILE, weights_only=True)["digest"]
    for entry in layout.REQUIRED_ENTRIES:
        assert (final / entry).exists()
    report = verify_bundle(final)
    assert report.ok, report.problems
    assert report.step == 4 and report.as_dict()["groups"] == 3


def test_writer_refuses_to_overwrite_and_to_publish_incomplete(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    before = tree(tmp_path)
    with pytest.raises(BundleExistsError):
        BundleWriter(tmp_path, 2).begin()
    assert tree(tmp_path) == before
    w = BundleWriter(tmp_path, 4).begin()
    torch.save({}, w.loader_path)  # no data_plane/, no sidecar
    with pytest.raises(FileNotFoundError, match="data_plane"):
        w.commit({"replay": {"digest": "x"}})
    assert not (tmp_path / "step_4").exists()
    w.abort()
    assert not w.tmp.exists()
    assert tree(tmp_path) == before, "abort touched something it did not create"


def test_writer_refuses_a_bundle_without_a_file_its_writers_reported(tmp_path: Path) -> None:
    """A writer on another node's disk (no shared volume) reports a file the committing process cannot see: the
    bundle is incomplete whatever the directory holds, never published with a manifest that leaves the file out."""
    w = BundleWriter(tmp_path, 4).begin()
    fields = write_contents(w, 4)
    shard = {"alg": w.hash_alg, "digest": "0" * 64, "size": 10}
    with pytest.raises(FileNotFoundError, match=r"1 file\(s\) its writers wrote are not in it \(first: "
                                                r"policy/__1_0\.distcp\)"):
        w.commit(fields, {"policy/__1_0.distcp": shard})
    assert not (tmp_path / "step_4").exists() and layout.step_dirs(tmp_path) == []
    w.abort()


def test_writer_quarantines_an_abandoned_tmp_of_the_same_step(tmp_path: Path) -> None:
    old = make_tmp_leftover(tmp_path, 6)
    old_files = tree(old)
    w = BundleWriter(tmp_path, 6).begin()
    final = w.commit(write_contents(w, 6))
    assert verify_bundle(final).ok
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and moved[0].name.startswith("tmp_step_6")
    assert tree(moved[0]) == old_files, "the abandoned save must be kept intact, not deleted"
    assert (tmp_path / layout.QUARANTINE_DIR / f"{moved[0].name}.reason.txt").read_text().strip()


def test_a_fenced_off_writer_removes_nothing_and_cannot_reach_its_successors_tmp(tmp_path: Path) -> None:
    """The old writer's tmp dir and the new holder's (same step) are different directories; the old writer's
    abort removes nothing once it lost the lease, and its publish is refused."""
    from sc_app.checkpoint.lease import Lease, LeaseLost

    old = BundleWriter(tmp_path, 6, lease=Lease.acquire(tmp_path, "old-run")).begin()
    write_contents(old, 6)
    new = BundleWriter(tmp_path, 6, lease=Lease.acquire(tmp_path, "new-run")).begin()
    assert old.tmp != new.tmp and old.tmp.is_dir() and new.tmp.is_dir()
    old.abort()
    assert old.tmp.is_dir(), "a fenced-off writer must not delete (the holder tidies its leftovers)"
    with pytest.raises(LeaseLost):
        old.commit({"replay": {"digest": "x"}})
    assert not (tmp_path / "step_6").exists()
    final = new.commit(write_contents(new, 6))
    assert verify_bundle(final).ok


def test_an_abandoned_save_is_never_renamed_and_its_tmp_dir_stays_for_quarantine(tmp_path: Path) -> None:
    """A stop that cannot wait for a save abandons it (issue 31, E): its commit refuses to rename, its abort leaves
    the tmp dir (the next holder's tidy quarantines it); once renamed, a save cannot be abandoned."""
    from sc_app.checkpoint.writer import SaveAbandoned

    w = BundleWriter(tmp_path, 4).begin()
    fields = write_contents(w, 4)
    assert w.abandon()
    with pytest.raises(SaveAbandoned):
        w.commit(fields)
    w.abort()
    assert w.tmp.is_dir() and not (tmp_path / "step_4").exists()

    done = BundleWriter(tmp_path, 6).begin()
    done.commit(write_contents(done, 6))
    assert not done.abandon(), "a published bundle stays published"
    assert verify_bundle(tmp_path / "step_6").ok


def test_a_sealed_bundle_lists_the_files_its_writers_uploaded_elsewhere_and_is_not_renamed(tmp_path: Path) -> None:
    from sc_app.io import hashing

    w = BundleWriter(tmp_path, 4).begin()
    fields = write_contents(w, 4)
    moved = w.policy_dir / "model.pt"
    away = {"policy/model.pt": hashing.digest_file(moved, w.hash_alg)}
    moved.unlink()  # uploaded by its rank: not in the tmp dir
    w.seal(fields, {"policy/model.pt": away["policy/model.pt"].as_dict()}, elsewhere=away)
    manifest = json.loads((w.tmp / "manifest.json").read_text())
    assert manifest["files"]["policy/model.pt"] == {"digest": away["policy/model.pt"].digest,
                                                    "size": away["policy/model.pt"].size}  # fmt: skip
    assert not (tmp_path / "step_4").exists() and w.tmp.is_dir(), "sealing renames nothing"
    with w.publishing():
        pass
    w.abort()
    assert not w.tmp.exists(), "published elsewhere: the sealed tmp dir goes"


def test_a_file_both_uploaded_and_in_the_tmp_dir_or_hashed_otherwise_is_refused(tmp_path: Path) -> None:
    from sc_app.io import hashing

    w = BundleWriter(tmp_path, 4).begin()
    fields = write_contents(w, 4)
    here = w.policy_dir / "model.pt"
    with pytest.raises(OSError, match="uploaded by its writer, yet also in the bundle's tmp dir"):
        w.seal(fields, elsewhere={"policy/model.pt": hashing.digest_file(here, w.hash_alg)})
    other = "sha256" if w.hash_alg != "sha256" else "blake3"
    with pytest.raises(OSError, match=f"hashed with {other} by its writer"):
        w.seal(fields, elsewhere={"policy/shard.distcp": hashing.FileDigest(other, "00", 1)})


def test_an_abandoned_save_never_reaches_its_commit_point_elsewhere(tmp_path: Path) -> None:
    from sc_app.checkpoint.writer import SaveAbandoned

    w = BundleWriter(tmp_path, 4).begin()
    w.seal(write_contents(w, 4))
    assert w.abandon()
    with pytest.raises(SaveAbandoned), w.publishing():
        raise AssertionError("the commit point ran after abandon()")
