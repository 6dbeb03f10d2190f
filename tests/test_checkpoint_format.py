"""The bundle on disk: BundleWriter (tmp → rename, manifest last), verify_bundle and plan_resume on real files.

Bundles are built by hand with ``torch.save`` and a data-plane ``metadata.json`` carrying the replay digest, so
these tests need neither Ray nor TransferQueue.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.checkpoint import BundleExistsError, BundleWriter, layout, plan_resume, prune, verify_bundle
from sc_app.checkpoint.manifest import HMAC_ENV, ManifestError, hmac_key_from_env, read_manifest
from sc_app.replay_buffer import SIDECAR_SCHEMA_VERSION, sidecar_digest

COMPAT = {"run.seed": 0, "grpo.num_generations_per_prompt": 2}


def sidecar(step: int) -> dict[str, Any]:
    groups = {
        f"p{step}{i}": {
            "sample_ids": [f"p{step}{i}:0", f"p{step}{i}:1"],
            "prompt_index": step * 10 + i,
            "version": step,
        }
        for i in range(3)
    }
    sd: dict[str, Any] = {"schema_version": SIDECAR_SCHEMA_VERSION, "partition": "train", "group_size": 2}
    sd["groups"] = groups
    sd["digest"] = sidecar_digest(sd)
    return sd


def write_contents(w: BundleWriter, step: int, *, dp_digest: str | None = None) -> dict[str, Any]:
    """Fill a begun writer like the controller does; returns the manifest fields to commit with."""
    torch.save({"model": {"w": torch.full((4,), float(step))}, "version": step}, w.policy_dir / "model.pt")
    torch.save({"state": {}, "param_groups": []}, w.policy_dir / "optimizer.pt")
    torch.save({"schema_version": 1, "next_index": step * 10, "reissue": []}, w.loader_path)
    sd = sidecar(step)
    w.data_plane_dir.mkdir()
    (w.data_plane_dir / "metadata.json").write_text(
        json.dumps({"storage_saved": True, "user_metadata": {"digest": dp_digest or sd["digest"], "step": step}})
    )
    (w.data_plane_dir / "simple_storage").mkdir()
    (w.data_plane_dir / "simple_storage" / "su_0.pkl").write_bytes(os.urandom(2048))
    torch.save(sd, w.sidecar_path)
    return {
        "run_id": "test",
        "replay": {"digest": sd["digest"], "groups": len(sd["groups"]), "rows": 2 * len(sd["groups"])},
        "compat": dict(COMPAT),
    }


def make_bundle(root: Path, step: int, *, hmac_key: bytes | None = None, dp_digest: str | None = None) -> Path:
    w = BundleWriter(root, step, hmac_key=hmac_key).begin()
    return w.commit(write_contents(w, step, dp_digest=dp_digest))


def make_tmp_leftover(root: Path, step: int) -> Path:
    """A save that died before its rename: complete-looking files, maybe even a manifest."""
    w = BundleWriter(root, step).begin()
    write_contents(w, step)
    return w.tmp


def tree(root: Path) -> dict[str, str]:
    """relative path → sha256 of every file under ``root``."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def contents_only(t: dict[str, str]) -> list[str]:
    """The multiset of file contents (moving files around keeps it; deleting does not)."""
    return sorted(t.values())


# ------------------------------------------------------------------------------------------------ writer
def test_layout_names() -> None:
    assert layout.step_name(12) == "step_12" and layout.tmp_name(12) == "tmp_step_12"
    assert layout.parse_step("step_12") == 12
    assert layout.parse_step("tmp_step_12") is None and layout.parse_step("step_x") is None
    assert layout.parse_step("step_12.bak") is None
    assert layout.parse_tmp("tmp_step_3") == 3 and layout.parse_tmp("step_3") is None


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
        assert info == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
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


# ------------------------------------------------------------------------------------------------ verify
def _truncate(p: Path) -> None:
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)


def _flip_byte(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("rel", "damage", "needle"),
    [
        ("policy/optimizer.pt", _truncate, "truncated"),
        ("policy/model.pt", _flip_byte, "sha256"),
        ("policy/model.pt", Path.unlink, "missing"),
        ("train_dataloader.pt", Path.unlink, "missing"),
        ("replay_buffer_metadata.pt", _truncate, "truncated"),
        ("data_plane/simple_storage/su_0.pkl", Path.unlink, "missing"),
        ("data_plane/metadata.json", _flip_byte, "sha256"),
        ("manifest.json", Path.unlink, "manifest missing"),
        ("manifest.json", _truncate, "not valid JSON"),
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
    report = verify_bundle(bundle, expected_compat={**COMPAT, "grpo.num_generations_per_prompt": 4})
    assert any("grpo.num_generations_per_prompt" in p for p in report.problems), report.problems
    report = verify_bundle(bundle, expected_compat={**COMPAT, "model.d_model": 64})
    assert any("model.d_model" in p for p in report.problems), report.problems


def test_manifest_schema_version_is_checked(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    doc = json.loads((bundle / "manifest.json").read_text())
    doc["schema_version"] = 999
    (bundle / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="schema_version"):
        read_manifest(bundle)


def test_hmac_signed_manifests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = b"s3cret"
    signed = make_bundle(tmp_path, 2, hmac_key=key)
    unsigned = make_bundle(tmp_path, 4)
    assert verify_bundle(signed, hmac_key=key).ok
    assert verify_bundle(signed).ok, "without a key the signature is not required"
    assert any("unsigned" in p for p in verify_bundle(unsigned, hmac_key=key).problems)
    assert any("signature" in p for p in verify_bundle(signed, hmac_key=b"other").problems)
    doc = json.loads((signed / "manifest.json").read_text())
    doc["step"] = 2
    doc["replay"]["groups"] = 99  # tamper with a signed field
    (signed / "manifest.json").write_text(json.dumps(doc))
    assert any("signature" in p for p in verify_bundle(signed, hmac_key=key).problems)
    monkeypatch.setenv(HMAC_ENV, "abc")
    assert hmac_key_from_env() == b"abc"
    monkeypatch.delenv(HMAC_ENV)
    assert hmac_key_from_env() is None


# ------------------------------------------------------------------------------------------------ plan_resume
def test_fresh_when_empty_or_absent(tmp_path: Path) -> None:
    assert plan_resume(tmp_path / "nope").decision == "fresh"
    assert plan_resume(tmp_path).decision == "fresh"


def test_newest_complete_bundle_wins(tmp_path: Path) -> None:
    for step in (2, 10, 4):
        make_bundle(tmp_path, step)
    plan = plan_resume(tmp_path, expected_compat=COMPAT)
    assert plan.decision == "resume" and plan.step == 10 and plan.bundle == tmp_path / "step_10"
    assert plan.quarantined == []
    assert [r.name for r in plan.reports] == ["step_10"], "older bundles need not be hashed once one verified"


def test_tmp_leftover_is_never_resumed_and_moved_to_quarantine(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    leftover = make_tmp_leftover(tmp_path, 4)
    # even a leftover whose manifest was written (died between manifest and rename) is not resumable
    w = BundleWriter(tmp_path, 6).begin()
    fields = write_contents(w, 6)
    (w.tmp / "manifest.json").write_text(json.dumps({"format": "sc-app/bundle", "step": 6, **fields}))
    leftovers = {p.name: tree(p) for p in (leftover, w.tmp)}
    before = contents_only(tree(tmp_path))

    dry = plan_resume(tmp_path, tidy=False)
    assert dry.step == 2 and dry.quarantined == []
    assert leftover.exists() and w.tmp.exists()

    plan = plan_resume(tmp_path)
    assert plan.decision == "resume" and plan.step == 2 and plan.bundle == tmp_path / "step_2"
    assert not leftover.exists() and not w.tmp.exists()
    assert len(plan.quarantined) == 2
    quarantine = tmp_path / layout.QUARANTINE_DIR
    for name, files in leftovers.items():
        moved = [p for p in quarantine.iterdir() if p.is_dir() and p.name.startswith(name + ".")]
        assert len(moved) == 1 and tree(moved[0]) == files, f"{name} was not kept intact"
        assert (quarantine / f"{moved[0].name}.reason.txt").exists()
    after = contents_only({k: v for k, v in tree(tmp_path).items() if not k.endswith(".reason.txt")})
    assert after == before, "tidying deleted or changed a file"


def test_only_tmp_leftovers_means_fresh_and_nothing_deleted(tmp_path: Path) -> None:
    leftover = make_tmp_leftover(tmp_path, 2)
    files = tree(leftover)
    plan = plan_resume(tmp_path)
    assert plan.decision == "fresh"
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert [tree(p) for p in moved] == [files]


@pytest.mark.parametrize(
    ("rel", "damage"),
    [("policy/model.pt", _truncate), ("replay_buffer_metadata.pt", Path.unlink), ("train_dataloader.pt", Path.unlink)],
)
def test_strict_refuses_a_bad_newest_bundle_and_moves_nothing(tmp_path: Path, rel: str, damage: Any) -> None:
    make_bundle(tmp_path, 2)
    newest = make_bundle(tmp_path, 4)
    damage(newest / rel)
    before = tree(tmp_path)
    plan = plan_resume(tmp_path, policy="strict")
    assert plan.decision == "refuse" and not plan.ok
    assert str(newest / rel) in plan.reason and "strict" in plan.reason, plan.reason
    assert plan.bundle is None
    assert tree(tmp_path) == before, "strict must not move or delete anything"


@pytest.mark.parametrize(
    ("rel", "damage"),
    [("policy/model.pt", _truncate), ("replay_buffer_metadata.pt", Path.unlink)],
)
def test_fallback_resumes_older_and_quarantines_the_bad_one(tmp_path: Path, rel: str, damage: Any) -> None:
    make_bundle(tmp_path, 2)
    newest = make_bundle(tmp_path, 4)
    damage(newest / rel)
    bad_files = tree(newest)
    before = contents_only(tree(tmp_path))
    plan = plan_resume(tmp_path, policy="fallback")
    assert plan.decision == "resume" and plan.step == 2
    assert "step_4" in plan.reason
    assert any(str(newest / rel) in p for p in plan.reports[0].problems)
    assert not newest.exists()
    moved = [p for p in (tmp_path / layout.QUARANTINE_DIR).iterdir() if p.is_dir()]
    assert len(moved) == 1 and tree(moved[0]) == bad_files, "the bad bundle must be kept, not deleted"
    reason = (tmp_path / layout.QUARANTINE_DIR / f"{moved[0].name}.reason.txt").read_text()
    assert str(newest / rel) in reason
    after = contents_only({k: v for k, v in tree(tmp_path).items() if not k.endswith(".reason.txt")})
    assert after == before


def test_no_bundle_verifies_refuses_and_moves_nothing(tmp_path: Path) -> None:
    b2, b4 = make_bundle(tmp_path, 2), make_bundle(tmp_path, 4)
    _truncate(b2 / "policy/model.pt")
    (b4 / "train_dataloader.pt").unlink()
    before = tree(tmp_path)
    for policy in ("fallback", "strict"):
        plan = plan_resume(tmp_path, policy=policy)  # type: ignore[arg-type]
        assert plan.decision == "refuse", policy
        assert "train_dataloader.pt" in plan.reason, plan.reason
        assert tree(tmp_path) == before, f"{policy}: a refused plan moved or deleted files"


def test_incompatible_config_is_a_refusal_naming_the_key(tmp_path: Path) -> None:
    make_bundle(tmp_path, 2)
    before = tree(tmp_path)
    plan = plan_resume(tmp_path, policy="strict", expected_compat={**COMPAT, "run.seed": 1})
    assert plan.decision == "refuse" and "run.seed" in plan.reason
    assert tree(tmp_path) == before


# ------------------------------------------------------------------------------------------------ retention
def test_prune_keeps_newest_and_never_the_newest_verified(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        make_bundle(tmp_path, step)
    removed = prune(tmp_path, keep=2)
    assert sorted(removed) == ["step_2", "step_4"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_6", "step_8"]
    _truncate(tmp_path / "step_8" / "policy/model.pt")  # newest no longer verifies: step_6 is the anchor
    assert prune(tmp_path, keep=1) == []
    assert (tmp_path / "step_6").exists() and (tmp_path / "step_8").exists()
    with pytest.raises(ValueError):
        prune(tmp_path, keep=0)


# ------------------------------------------------------------------------------------------------ hostile manifests
def _edit_manifest(bundle: Path, edit: Any) -> None:
    doc = json.loads((bundle / "manifest.json").read_text())
    edit(doc)
    (bundle / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d.__setitem__("step", "two"), id="step-not-int"),
        pytest.param(lambda d: d.__setitem__("files", []), id="files-not-mapping"),
        pytest.param(lambda d: d["files"].__setitem__("policy/model.pt", "abc"), id="file-entry-not-mapping"),
        pytest.param(lambda d: d.__setitem__("replay", ["x"]), id="replay-not-mapping"),
        pytest.param(lambda d: d["replay"].pop("digest"), id="replay-without-digest"),
        pytest.param(lambda d: d.__setitem__("compat", "x"), id="compat-not-mapping"),
    ],
)
def test_malformed_manifest_is_a_problem_not_a_crash(tmp_path: Path, edit: Any) -> None:
    """Valid JSON with the wrong shapes (hand-edited, or a bit flip that kept it parseable) is reported, naming
    manifest.json — never a traceback out of ``ckpt verify`` or ``plan_resume``."""
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    _edit_manifest(bundle, edit)
    report = verify_bundle(bundle, expected_compat=COMPAT)
    assert not report.ok
    assert any(str(bundle / "manifest.json") in p for p in report.problems), report.problems
    report.as_dict()  # what `ckpt list/verify --json` print must not crash either
    plan = plan_resume(tmp_path, policy="fallback", expected_compat=COMPAT)
    assert plan.decision == "resume" and plan.step == 2


@pytest.mark.parametrize("rel", ["../step_2/policy/model.pt", "/etc/hostname", "policy/../../step_2/manifest.json"])
def test_manifest_paths_outside_the_bundle_are_refused(tmp_path: Path, rel: str) -> None:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    _edit_manifest(bundle, lambda d: d["files"].__setitem__(rel, {"sha256": "0" * 64, "size": 1}))
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
