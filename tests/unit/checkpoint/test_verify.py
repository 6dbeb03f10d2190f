"""checkpoint.verify: every damage is a named problem, never a crash; nothing is deserialised before it verified."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.checkpoint import BundleWriter, layout, verify_bundle
from tests.support.bundles import COMPAT, edit_manifest, flip_byte, make_bundle, tree, truncate, write_contents


@pytest.mark.parametrize(
    ("rel", "damage", "needle"),
    [
        ("policy/optimizer.pt", truncate, "truncated"),
        ("policy/model.pt", flip_byte, "blake3 does not match"),
        ("policy/model.pt", Path.unlink, "missing"),
        ("train_dataloader.pt", Path.unlink, "missing"),
        ("replay_buffer_metadata.pt", truncate, "truncated"),
        ("data_plane/part-00-00000.bin", Path.unlink, "missing"),
        ("data_plane/part-00-00001.json", truncate, "truncated"),
        ("data_plane/metadata.json", flip_byte, "blake3 does not match"),
        ("manifest.json", Path.unlink, "manifest missing"),
        ("manifest.json", truncate, "not valid JSON"),
    ],
)
def test_verify_names_the_damaged_file(tmp_path: Path, rel: str, damage: Any, needle: str) -> None:
    bundle = make_bundle(tmp_path, 2)
    damage(bundle / rel)
    before = tree(tmp_path)
    report = verify_bundle(bundle)
    assert not report.ok
    named = [p for p in report.problems if str(bundle / rel) in p]
    assert named, report.problems
    assert any(needle in p for p in named), report.problems
    assert tree(tmp_path) == before, "verification must not modify or delete anything"


def test_verify_flags_files_added_after_sealing(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    (bundle / "policy" / "extra.pt").write_bytes(b"x")
    report = verify_bundle(bundle)
    assert any("extra.pt" in p and "not listed" in p for p in report.problems), report.problems


def test_verify_cross_checks_data_plane_digest(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2, dp_digest="f" * 64)  # hashes all fine, the pair does not belong together
    report = verify_bundle(bundle)
    assert any("data_plane/metadata.json" in p and "digest" in p for p in report.problems), report.problems
    assert verify_bundle(bundle, deep=False).ok, "deep=False checks structure and sizes only"


def test_verify_cross_checks_sidecar_digest(tmp_path: Path) -> None:
    w = BundleWriter(tmp_path, 2).begin()
    fields = write_contents(w, 2)
    sd = torch.load(w.sidecar_path, weights_only=True)
    sd["groups"].popitem()  # index no longer matches its own digest
    torch.save(sd, w.sidecar_path)
    bundle = w.commit(fields)
    report = verify_bundle(bundle)
    assert any(layout.SIDECAR_FILE in p and "digest" in p for p in report.problems), report.problems


def test_verify_checks_step_and_compat(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    renamed = bundle.rename(tmp_path / "step_3")
    assert any("records step 2" in p for p in verify_bundle(renamed).problems)
    renamed.rename(bundle)
    assert verify_bundle(bundle, expected_compat=COMPAT).ok
    report = verify_bundle(bundle, expected_compat={**COMPAT, "grpo.group_size": 4})
    assert any("grpo.group_size" in p for p in report.incompatible) and report.verified and not report.ok
    report = verify_bundle(bundle, expected_compat={**COMPAT, "model.d_model": 64})
    assert any("model.d_model" in p for p in report.incompatible), report.incompatible


@pytest.mark.parametrize("rel", ["../step_2/policy/model.pt", "/etc/hostname", "policy/../../step_2/manifest.json"])
def test_manifest_paths_outside_the_bundle_are_refused(tmp_path: Path, rel: str) -> None:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    edit_manifest(bundle, lambda d: d["files"].__setitem__(rel, {"digest": "0" * 64, "size": 1}))
    report = verify_bundle(bundle)
    assert any(rel in p and "outside the bundle" in p for p in report.problems), report.problems


@pytest.mark.parametrize("content", ["[1, 2]", '{"user_metadata": ["x"]}', '"just a string"'])
def test_data_plane_metadata_of_the_wrong_shape_is_a_problem(tmp_path: Path, content: str) -> None:
    w = BundleWriter(tmp_path, 2).begin()
    fields = write_contents(w, 2)
    (w.data_plane_dir / "metadata.json").write_text(content)  # hashes will match: only the parse can object
    bundle = w.commit(fields)
    report = verify_bundle(bundle)
    assert any("data_plane/metadata.json" in p for p in report.problems), report.problems


def test_a_bundle_that_records_a_key_under_its_old_name_is_compared_under_the_new_one() -> None:
    """Bundles cut before grpo.num_generations_per_prompt became grpo.group_size record the old name."""
    from sc_app.checkpoint.verify import compat_problems

    old = {k: v for k, v in COMPAT.items() if k != "grpo.group_size"}
    old["grpo.num_generations_per_prompt"] = COMPAT["grpo.group_size"]
    assert compat_problems(old, COMPAT) == []
    changed = {**COMPAT, "grpo.group_size": COMPAT["grpo.group_size"] + 2}
    assert compat_problems(old, changed) == [
        f"incompatible: grpo.group_size is {COMPAT['grpo.group_size']} in the bundle but "
        f"{changed['grpo.group_size']} in the config"
    ]
