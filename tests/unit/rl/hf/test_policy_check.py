"""The ``sc-app/dcp-v1`` policy checker: verification of an hf bundle's ``policy/`` parses what the restore parses
(``.metadata`` through the allowlist unpickler) and checks it against the model its ``hf/config.json`` describes."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.checkpoint import verify_bundle
from sc_app.rl.hf.policy_ckpt import POLICY_FORMAT
from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings
from tests.support.bundles import make_bundle, reseal
from tests.support.hf import make_model_dir
from tests.support.hostile import ShellPayload


@pytest.fixture(scope="module")
def hf_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real hf policy directory: one step of the trainer, captured and written as a save writes it."""
    root = tmp_path_factory.mktemp("policy")
    trainer = HFTrainer(TrainerSettings(str(make_model_dir(root / "model")), prompt_len=3), 0, 1, torch.device("cpu"))
    tokens = torch.randint(4, 20, (4, 7), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(tokens)
    trainer.train_step(TrainBatch(tokens, ones, torch.ones(4, 4, dtype=torch.long), torch.full((4, 4), -3.0),
                                  torch.randn(4)), 1)  # fmt: skip
    trainer.capture()
    (root / "policy").mkdir()
    trainer.write_captured(root / "policy")
    return root / "policy"


def hf_bundle(tmp_path: Path, policy: Path, edit: Any = None) -> Path:
    bundle = make_bundle(tmp_path, 2)
    shutil.rmtree(bundle / "policy")
    shutil.copytree(policy, bundle / "policy")
    if edit is not None:
        edit(bundle / "policy")
    reseal(bundle, lambda d: d.update(policy_format=POLICY_FORMAT))
    return bundle


def problems(bundle: Path) -> list[str]:
    return verify_bundle(bundle).problems


def test_a_policy_the_trainer_wrote_verifies(tmp_path: Path, hf_policy: Path) -> None:
    assert problems(hf_bundle(tmp_path, hf_policy)) == []


def test_without_the_format_it_is_checked_as_a_tiny_policy_and_refused(tmp_path: Path, hf_policy: Path) -> None:
    bundle = hf_bundle(tmp_path, hf_policy)
    reseal(bundle, lambda d: d.pop("policy_format"))
    assert any("model.pt" in p for p in problems(bundle))


def test_a_file_the_format_does_not_have_is_named(tmp_path: Path, hf_policy: Path) -> None:
    bundle = hf_bundle(tmp_path, hf_policy, lambda d: (d / "notes.txt").write_text("x"))
    assert any(f"notes.txt: not a file of policy format {POLICY_FORMAT}" in p for p in problems(bundle))


def test_a_resealed_malicious_metadata_is_refused_without_running(tmp_path: Path, hf_policy: Path) -> None:
    marker = tmp_path / "pwned"
    bundle = hf_bundle(tmp_path, hf_policy, lambda d: (d / ".metadata").write_bytes(pickle.dumps(ShellPayload(marker))))
    assert any(r"refers to posix.system" in p for p in problems(bundle))
    assert not marker.exists()


def test_garbled_metadata_is_a_problem_not_a_crash(tmp_path: Path, hf_policy: Path) -> None:
    bundle = hf_bundle(tmp_path, hf_policy, lambda d: (d / ".metadata").write_bytes(b"\x80\x05garbage"))
    assert any(".metadata is not DCP metadata" in p for p in problems(bundle))


def test_weights_that_do_not_fit_the_recorded_model_are_named(tmp_path: Path, hf_policy: Path) -> None:
    def wider(d: Path) -> None:
        cfg = json.loads((d / "hf" / "config.json").read_text())
        cfg["intermediate_size"] *= 2
        (d / "hf" / "config.json").write_text(json.dumps(cfg))

    found = problems(hf_bundle(tmp_path, hf_policy, wider))
    assert any("weight model.layers.0.mlp.gate_proj.weight is" in p for p in found), found
    assert any("optimizer state optimizer.state.model.layers.0.mlp.gate_proj.weight.exp_avg" in p for p in found)


def test_a_shard_shorter_than_its_metadata_says_is_named(tmp_path: Path, hf_policy: Path) -> None:
    def cut(d: Path) -> None:
        shard = d / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:1000])

    assert any("__0_0.distcp: .metadata places" in p for p in problems(hf_bundle(tmp_path, hf_policy, cut)))


def test_a_missing_model_config_is_named(tmp_path: Path, hf_policy: Path) -> None:
    bundle = hf_bundle(tmp_path, hf_policy, lambda d: (d / "hf" / "config.json").unlink())
    assert any("hf/config.json" in p for p in problems(bundle))
