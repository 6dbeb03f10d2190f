"""Corrupted, tampered and foreign bundles: each is named, never resumed, quarantined (not deleted) or refused.

The bundles are those of a real run (real Ray + TransferQueue): the first attempt of the suite's shared interrupted
run (``interrupted_run``, ``tests/support/interrupted.py``: ``--max-steps 4``, a bundle every 2 steps) writes
step_2 and step_4; every test damages a copy of that directory and checks what ``verify``/``plan_resume``/the CLI
make of it: ``preflight``, ``ckpt`` in this process (the ``cli`` fixture). Only the tests of a run's fallback start
Ray (subprocesses of their own).
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from sc_app.checkpoint import hmac_key_from_env, plan_resume, prune, verify_bundle
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.manifest import HMAC_ENV, render
from sc_app.config.app import load_config
from sc_app.io.hashing import digest_file
from tests.support.cli import InProcess
from tests.support.interrupted import Interrupted
from tests.support.proc import sc_app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine(interrupted_run: Interrupted) -> Path:
    """Shared, read-only: a test that changes it works on ``ckpt``, a copy."""
    root = interrupted_run.pristine
    assert sorted(p.name for p in root.glob("step_*")) == ["step_2", "step_4"]
    return root


@pytest.fixture
def ckpt(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(pristine, copy)
    return copy


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def reseal(bundle: Path, mutate_doc=None) -> None:
    """Rewrite the manifest so its hashes match the (tampered) files: only deeper checks can catch it."""
    doc = json.loads((bundle / "manifest.json").read_text())
    for rel in doc["files"]:
        got = digest_file(bundle / rel, doc["hash_alg"])
        doc["files"][rel] = {"digest": got.digest, "size": got.size}
    if mutate_doc:
        mutate_doc(doc)
    doc.pop("signature", None)
    body = {k: v for k, v in doc.items() if k not in ("format", "schema_version")}
    (bundle / "manifest.json").write_bytes(render(body, hmac_key_from_env()))


def expect_fallback(ckpt: Path, needle: str) -> None:
    """fallback: step_4 is skipped and quarantined with a reason naming the problem; step_2 is resumed."""
    plan = plan_resume(ckpt)
    assert plan.decision == "resume" and plan.step == 2
    bad = plan.reports[0]
    assert bad.name == "step_4" and any(needle in p for p in bad.problems), bad.problems
    moved = list((ckpt / "quarantine").glob("step_4.*"))
    dirs = [p for p in moved if p.is_dir()]
    reasons = [p for p in moved if p.name.endswith(".reason.txt")]
    assert len(dirs) == 1 and len(reasons) == 1
    assert needle in reasons[0].read_text()


def expect_strict_refusal(ckpt: Path, needle: str) -> None:
    before = files_under(ckpt)
    plan = plan_resume(ckpt, on_corrupt="strict")
    assert plan.decision == "refuse" and needle in plan.reason
    assert files_under(ckpt) == before, "strict moves nothing"


def test_pristine_bundles_verify(pristine: Path) -> None:
    assert all(verify_bundle(p).ok for p in pristine.glob("step_*"))


def test_truncated_file(ckpt: Path) -> None:
    target = ckpt / "step_4" / "policy" / "optimizer.pt"
    target.write_bytes(target.read_bytes()[:100])
    expect_strict_refusal(ckpt, "optimizer.pt: size 100")
    expect_fallback(ckpt, "optimizer.pt: size 100")


def test_flipped_byte(ckpt: Path) -> None:
    target = ckpt / "step_4" / "policy" / "model.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    expect_strict_refusal(ckpt, "model.pt: blake3 does not match")
    expect_fallback(ckpt, "model.pt: blake3 does not match")


def test_missing_sidecar(ckpt: Path) -> None:
    (ckpt / "step_4" / "replay_buffer_metadata.pt").unlink()
    expect_fallback(ckpt, "replay_buffer_metadata.pt: missing")


def test_missing_data_plane(ckpt: Path) -> None:
    shutil.rmtree(ckpt / "step_4" / "data_plane")
    expect_fallback(ckpt, "data_plane: missing")


def test_sidecar_digest_differs_from_data_plane(ckpt: Path) -> None:
    path = ckpt / "step_4" / "replay_buffer_metadata.pt"
    sidecar = torch.load(path, weights_only=True)
    from sc_app.io.digest import sidecar_digest

    gid = next(iter(sidecar["groups"]))
    del sidecar["groups"][gid]  # a self-consistent sidecar that describes other rows
    sidecar["digest"] = sidecar_digest(sidecar)
    torch.save(sidecar, path)
    reseal(ckpt / "step_4")
    expect_fallback(ckpt, "sidecar digest != data-plane digest")


def test_missing_manifest(ckpt: Path) -> None:
    (ckpt / "step_4" / "manifest.json").unlink()
    expect_fallback(ckpt, "manifest missing")


def test_unparsable_manifest(ckpt: Path) -> None:
    (ckpt / "step_4" / "manifest.json").write_text('{"format": "sc-app/bundle", "step": 4, "fil')
    expect_fallback(ckpt, "not valid JSON")


def test_unknown_schema_version(ckpt: Path) -> None:
    path = ckpt / "step_4" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["schema_version"] = 99
    path.write_text(json.dumps(doc))
    expect_fallback(ckpt, "unknown schema_version 99")


def test_leftover_tmp_is_quarantined_never_resumed(ckpt: Path) -> None:
    shutil.copytree(ckpt / "step_4", ckpt / "tmp_step_6")  # complete-looking, but never renamed
    plan = plan_resume(ckpt)
    assert plan.step == 4
    assert not (ckpt / "tmp_step_6").exists()
    moved = [p for p in (ckpt / "quarantine").iterdir() if p.name.startswith("tmp_step_6.")]
    assert any(p.is_dir() for p in moved) and any(p.name.endswith(".reason.txt") for p in moved)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("grpo.group_size=4", "grpo.group_size is 8 in the bundle but 4"),
        ("model.d_model=32", "model.d_model is 64 in the bundle but 32"),
        ("run.seed=7", "run.seed is 0 in the bundle but 7"),  # a bundle from a different run
    ],
)
def test_incompatible_config_is_named(cli: InProcess, ckpt: Path, override: str, needle: str) -> None:
    cfg = load_config(overrides=[override, "ray.num_cpus=16"])
    before = files_under(ckpt)
    plan = plan_resume(ckpt, expected_compat=compat_of(cfg))
    assert plan.decision == "refuse" and needle in plan.reason
    assert files_under(ckpt) == before, "nothing is moved when no bundle could be resumed"
    res = cli("preflight", "--checkpoint-dir", str(ckpt), "--set", override, "--set", "ray.num_cpus=16")
    assert res.rc == 2 and needle in res.out


def test_another_storage_unit_count_resumes_a_streamed_bundle(ckpt: Path) -> None:
    """The streamed snapshot re-routes its rows on restore: the unit count does not bind it (a native one does,
    ``tests/unit/checkpoint/test_compat.py``)."""
    cfg = load_config(overrides=["data_plane.storage_units=2", "ray.num_cpus=16"])
    plan = plan_resume(ckpt, expected_compat=compat_of(cfg))
    assert plan.decision == "resume" and plan.step == 4, plan.reason


def test_ckpt_verify_cli_names_the_problem(cli: InProcess, ckpt: Path) -> None:
    (ckpt / "step_4" / "train_dataloader.pt").write_bytes(b"")
    res = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert res.rc == 2
    assert "step_2: verified" in res.out and "train_dataloader.pt: size 0" in res.out


class _Boom:
    """Unpickling this writes a marker file: the proof that a file reached an unpickler."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path(self.marker).write_text, ("unpickled!",))


def test_tampered_pickle_never_reaches_an_unpickler(ckpt: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    sidecar = ckpt / "step_4" / "replay_buffer_metadata.pt"
    sidecar.write_bytes(pickle.dumps(_Boom(str(marker))))
    assert not verify_bundle(ckpt / "step_4").ok  # hash mismatch: never loaded
    reseal(ckpt / "step_4")  # an attacker who can also rewrite the manifest (no HMAC key configured)
    report = verify_bundle(ckpt / "step_4")
    assert not report.ok and any("does not load as a weights-only" in p for p in report.problems)  # refused
    assert not marker.exists()


def test_hmac_signed_manifests(ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HMAC_ENV, "k1")
    report = verify_bundle(ckpt / "step_4", hmac_key=b"k1")
    assert not report.ok and "unsigned manifest" in report.problems[0]
    reseal(ckpt / "step_4")  # signs with k1 (from the environment)
    assert verify_bundle(ckpt / "step_4", hmac_key=b"k1").ok
    wrong = verify_bundle(ckpt / "step_4", hmac_key=b"k2")
    # the keyring names the signing key's id when it is not in the ring (checkpoint/hmac_keys.py)
    assert not wrong.ok and "signature is by key id" in wrong.problems[0], wrong.problems
    assert "not in the keyring" in wrong.problems[0], wrong.problems
    reseal(ckpt / "step_4", mutate_doc=lambda d: d.update(step=4))
    path = ckpt / "step_4" / "manifest.json"
    doc = json.loads(path.read_text())
    doc["trainer_version"] = 999  # tamper after signing
    path.write_text(json.dumps(doc))
    assert "signature does not match" in verify_bundle(ckpt / "step_4", hmac_key=b"k1").problems[0]


def _wrong_shape_weights(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    state["model"]["tok.weight"] = torch.zeros(3, 3)  # loads as tensors; fits no model of this config
    torch.save(state, path)


def _header_naming_a_bin_outside(path: Path) -> None:
    header = json.loads(path.read_text())
    header["bin"] = "../../step_2/data_plane/part-00-00000.bin"
    path.write_text(json.dumps(header))


# Files that do not parse (or do not fit), resealed by someone with volume access but without the HMAC key: the
# hashes match, so only parsing with the restore's validators catches them.
UNPARSABLE = {
    "weights of another shape": ("policy/model.pt", _wrong_shape_weights, "'tok.weight' is (3, 3)"),
    "optimizer state that is no optimizer's": (
        "policy/optimizer.pt",
        lambda p: torch.save({"state": {}, "param_groups": []}, p),
        "param_groups is not a list of 1 group(s)",
    ),
    "loader place of the wrong type": (
        "train_dataloader.pt",
        lambda p: torch.save({"schema_version": 1, "next_index": "7", "reissue": []}, p),
        "next_index '7'",
    ),
    "part header naming a bin outside": (
        "data_plane/part-00-00000.json",
        _header_naming_a_bin_outside,
        "a part header names only its own part-00-00000.bin",
    ),
    "metadata.json that is not JSON": ("data_plane/metadata.json", lambda p: p.write_text("{"), "not valid JSON"),
}


@pytest.mark.parametrize("case", list(UNPARSABLE))
def test_resealed_unparsable_file_fails_verify_and_preflight(cli: InProcess, ckpt: Path, case: str) -> None:
    rel, damage, needle = UNPARSABLE[case]
    damage(ckpt / "step_4" / rel)
    reseal(ckpt / "step_4")
    res = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert res.rc == 2 and "step_2: verified" in res.out, res.out[-3000:]
    assert f"{ckpt / 'step_4' / rel}: " in res.out and needle in res.out, res.out[-3000:]
    res = cli("preflight", "--checkpoint-dir", str(ckpt), "--dry-run")
    assert res.rc == 0 and "decision: resume step_2 (step 2)" in res.out and needle in res.out, res.out[-3000:]
    assert "Traceback" not in res.out


def test_prune_keeps_newest_verified_pinned_and_unverifiable(cli: InProcess, ckpt: Path) -> None:
    for step in (0, 1):
        shutil.copytree(ckpt / "step_2", ckpt / f"step_{step}")
        reseal(ckpt / f"step_{step}", mutate_doc=lambda d, s=step: d.update(step=s))
    (ckpt / "step_0" / "manifest.json").unlink()  # an old bundle that cannot be verified is never deleted
    (ckpt / "step_4" / "policy" / "model.pt").write_bytes(b"x")  # the newest is corrupt
    assert prune(ckpt, keep=1) == ["step_1"]
    assert (ckpt / "step_4").exists(), "newer than the newest verified: never pruned"
    assert (ckpt / "step_2").exists(), "the newest verified bundle always stays"
    assert (ckpt / "step_0").exists(), "unverifiable: left for an operator"
    shutil.copytree(ckpt / "step_2", ckpt / "step_1")
    reseal(ckpt / "step_1", mutate_doc=lambda d: d.update(step=1))
    (ckpt / "pins").mkdir()
    (ckpt / "pins" / "step_1").touch()
    assert prune(ckpt, keep=1) == [], "pinned"
    res = cli("ckpt", "prune", "--checkpoint-dir", str(ckpt), "--keep", "0")
    assert res.rc == 2 and "--keep must be >= 1" in res.out


def test_manifest_records_agree_with_the_files(pristine: Path) -> None:
    """Step, epoch, trainer version, loader place, index and digest were captured once and agree everywhere."""
    lease = json.loads((pristine / "LEASE").read_text())
    for bundle in sorted(pristine.glob("step_*")):
        doc = json.loads((bundle / "manifest.json").read_text())
        step = int(bundle.name[5:])
        model = torch.load(bundle / "policy" / "model.pt", weights_only=True)
        loader = torch.load(bundle / "train_dataloader.pt", weights_only=True)
        sidecar = torch.load(bundle / "replay_buffer_metadata.pt", weights_only=True)
        data_plane = json.loads((bundle / "data_plane" / "metadata.json").read_text())["user_metadata"]
        assert doc["step"] == step == data_plane["step"]
        assert doc["epoch"] == lease["epoch"] == data_plane["epoch"]
        assert doc["trainer_version"] == model["version"] == data_plane["trainer_version"] == step
        assert doc["loader"]["next_index"] == loader["next_index"] == data_plane["loader"]["next_index"]
        assert doc["replay"]["digest"] == sidecar["digest"] == data_plane["digest"]
        assert doc["replay"]["groups"] == len(sidecar["groups"]) == data_plane["groups"]


# A bundle that verifies but cannot be restored: verification parses every file with the restore's validators, so a
# damaged file no longer gets this far; what is left is the environment (a device out of memory, a broken node),
# injected here in the trainers loading step_4 only.
RESTORE_FAULT = {"SC_APP_FAULT_AT": "restore.policy.step_4", "SC_APP_FAULT_ACTION": "raise"}


def test_a_bundle_that_verifies_but_does_not_restore_falls_back_in_the_same_run(ckpt: Path) -> None:
    """step_4 verifies but its restore fails: the run moves step_4 aside (an older bundle verifies) and resumes
    step_2, in the same process."""
    assert verify_bundle(ckpt / "step_4").ok, "only a restore can find this"
    res = sc_app(
        "run", "--checkpoint-dir", str(ckpt), "--max-steps", "5", "--set", "checkpoint.save_period=2", env=RESTORE_FAULT
    )
    assert res.rc == 0, res.out[-3000:]
    assert "step_4 verified but could not be restored" in res.out, res.out[-3000:]
    assert f"resuming from {ckpt / 'step_2'} (step 2)" in res.out and "done: step 5" in res.out
    moved = [p for p in (ckpt / "quarantine").glob("step_4.*") if p.is_dir()]
    assert len(moved) == 1 and (moved[0] / "policy" / "model.pt").is_file(), "moved aside, never deleted"
    assert "Traceback" not in res.out


def test_strict_refuses_a_bundle_that_does_not_restore_and_moves_nothing(ckpt: Path) -> None:
    before = files_under(ckpt)
    res = sc_app(
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        "5",
        "--set",
        "checkpoint.on_corrupt=strict",
        env=RESTORE_FAULT,
    )
    assert res.rc == 2 and "could not be restored" in res.out, res.out[-3000:]
    after = files_under(ckpt)
    assert {k: v for k, v in after.items() if k.startswith("step_")} == {
        k: v for k, v in before.items() if k.startswith("step_")
    }, "strict moves no bundle"


def test_a_run_passes_a_resealed_bundle_and_another_lineage_and_resumes_its_own(ckpt: Path) -> None:
    """One run, two bundles newer than step_2 it must not resume:

    * step_4 with weights of the wrong shape, resealed (its digests match). Before verification parsed files it
      verified and every retry died at restore ("does not load into the configured model"); now it is quarantined
      and the run resumes step_2;
    * step_100, copied in from another job (another lineage), valid on its own: set aside, never resumed, and
      retention neither counts nor deletes anything because of it.
    The run trains on to step 8 and keeps two bundles of its own (keep=2), both verified."""
    lineage = json.loads((ckpt / "LINEAGE").read_text())["lineage"]
    stranger = ckpt / "step_100"
    shutil.copytree(ckpt / "step_4", stranger)
    meta_path = stranger / "data_plane" / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["user_metadata"]["step"] = 100  # what the other job's data plane would record
    meta_path.write_text(json.dumps(meta))
    reseal(stranger, lambda doc: doc.update(step=100, lineage="another-job"))
    assert verify_bundle(stranger).ok, "valid on its own: only the lineage tells it apart"
    _wrong_shape_weights(ckpt / "step_4" / "policy" / "model.pt")
    reseal(ckpt / "step_4")
    res = sc_app(
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        "8",
        "--set",
        "checkpoint.save_period=2",
        "--set",
        "checkpoint.keep=2",
    )
    assert res.rc == 0, res.out[-3000:]
    assert f"resuming from {ckpt / 'step_2'} (step 2)" in res.out and "another-job" in res.out, res.out[-3000:]
    assert "Traceback" not in res.out
    own = sorted(int(p.name[5:]) for p in ckpt.glob("step_*") if p.name[5:].isdigit())
    assert own == [6, 8], own  # keep=2 of its own; the stranger was set aside, not deleted, not counted
    assert all(verify_bundle(ckpt / f"step_{s}").ok for s in own)
    for name in ("step_4", "step_100"):  # the bad bundle and the stranger are kept in quarantine
        moved = [p for p in (ckpt / "quarantine").iterdir() if p.name.startswith(f"{name}.") and p.is_dir()]
        assert len(moved) == 1, name
    assert json.loads((ckpt / "LINEAGE").read_text())["lineage"] == lineage
