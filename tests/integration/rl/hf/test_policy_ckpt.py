"""hf backend: DDP and FSDP2 trainers on CPU/gloo, sharded policy checkpoints with DCP written by every rank in
parallel behind training, loaded by another world size (2 → 1, 1 → 2) with identical weights and optimizer
state, and reads that deserialise nothing the manifest has not vouched for."""

from __future__ import annotations

import hashlib
import pickle
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.io import hashing
from sc_app.rl.backend import PolicyFingerprint
from sc_app.rl.hf import policy_ckpt
from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings
from tests.support.hf import make_model_dir, run_ranks
from tests.support.hostile import ShellPayload

CPU = torch.device("cpu")
P, R = 4, 4


def settings(model_dir: str, strategy: str) -> TrainerSettings:
    return TrainerSettings(model_path=model_dir, strategy=strategy, learning_rate=1e-2, prompt_len=P)  # type: ignore[arg-type]


def make_batch(trainer: HFTrainer, rank: int, n: int = 6) -> TrainBatch:
    g = torch.Generator().manual_seed(100 + rank)
    vocab = trainer.hf_model.config.vocab_size
    tokens = torch.randint(4, vocab, (n, P + R), generator=g)
    mask = torch.ones_like(tokens)
    rmask = torch.ones(n, R, dtype=torch.long)
    rmask[0, 2:] = 0
    with torch.no_grad():
        old = sequence_logprobs(trainer.model, tokens, mask, P)
    return TrainBatch(tokens, mask, rmask, old, torch.randn(n, generator=g))


def fp_dict(fp: PolicyFingerprint | None) -> dict[str, str] | None:
    return None if fp is None else {"weights": fp.weights, "optimizer": fp.optimizer}


def files_json(write: policy_ckpt.PolicyWrite) -> dict[str, str]:
    return {name: hashing.label(rec.alg, rec.digest) for name, rec in write.files.items()}


# ------------------------------------------------------------------------------------------------ rank functions
def save_ranks(rank: int, world: int, model_dir: str, strategy: str, policy_dir: str) -> dict[str, Any]:
    """Train 2 steps, capture, then write on a thread while the training thread takes 2 more steps."""
    trainer = HFTrainer(settings(model_dir, strategy), rank, world, CPU)
    param_type = type(next(trainer.model.parameters())).__name__
    batch = make_batch(trainer, rank)
    losses = [trainer.train_step(batch, v).loss for v in (1, 2)]
    assert trainer.capture() == 2
    at_capture = trainer.fingerprint()
    result: dict[str, Any] = {}

    def write() -> None:
        result["write"] = trainer.write_captured(policy_dir)

    Path(policy_dir).mkdir(parents=True, exist_ok=True)
    t = threading.Thread(target=write)
    t.start()
    losses += [trainer.train_step(batch, v).loss for v in (3, 4)]
    t.join()
    return {
        "param_type": param_type,
        "losses": losses,
        "at_capture": fp_dict(at_capture),
        "after": fp_dict(trainer.fingerprint()),
        "files": files_json(result["write"]),
    }


def load_ranks(rank: int, world: int, model_dir: str, strategy: str, policy_dir: str, expected: dict) -> dict:
    trainer = HFTrainer(settings(model_dir, strategy), rank, world, CPU)
    before = trainer.fingerprint()
    meta = trainer.load(policy_dir, expected)
    loaded = trainer.fingerprint()
    trainer.train_step(make_batch(trainer, rank), meta.version + 1)  # the restored optimizer steps
    return {"before": fp_dict(before), "loaded": fp_dict(loaded), "meta": [meta.version, meta.world_size]}


def merged(results: list[dict[str, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for r in results:
        out.update(r["files"])
    return out


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(make_model_dir(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def saved_by_two(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("fsdp2")
    policy = tmp / "policy"
    return policy, run_ranks(save_ranks, 2, model_dir, "fsdp", str(policy), tmp=tmp)


@pytest.fixture(scope="module")
def saved_by_one(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    policy = tmp_path_factory.mktemp("one") / "policy"
    return policy, save_ranks(0, 1, model_dir, "ddp", str(policy))


# ------------------------------------------------------------------------------------------------ tests
def test_fsdp2_trains_on_cpu_over_gloo(saved_by_two: tuple[Path, list[dict[str, Any]]]) -> None:
    _, results = saved_by_two
    assert [r["param_type"] for r in results] == ["DTensor", "DTensor"], "fully_shard turned parameters into shards"
    for r in results:
        assert all(torch.isfinite(torch.tensor(loss)) for loss in r["losses"])
        assert r["after"] is None or r["after"] != r["at_capture"], "training went on while the save was written"
    assert results[1]["at_capture"] is None, "only rank 0 holds the gathered fingerprint"


def test_every_rank_wrote_its_own_shard_and_the_hashes_are_the_files(
    saved_by_two: tuple[Path, list[dict[str, Any]]],
) -> None:
    policy, results = saved_by_two
    assert {n for n in results[1]["files"]} == {"__1_0.distcp"}
    assert {"__0_0.distcp", ".metadata", "hf/config.json", "hf/tokenizer.json"} <= set(results[0]["files"])
    for name, labelled in merged(results).items():
        assert labelled.startswith("blake3:") and hashing.bytes_match((policy / name).read_bytes(), labelled), name
    assert (policy / "__0_0.distcp").stat().st_size > 0 and (policy / "__1_0.distcp").stat().st_size > 0


def test_two_ranks_to_one_restores_identical_weights_and_optimizer(
    model_dir: str, saved_by_two: tuple[Path, list[dict[str, Any]]]
) -> None:
    policy, results = saved_by_two
    out = load_ranks(0, 1, model_dir, "ddp", str(policy), merged(results))
    assert out["before"] != results[0]["at_capture"], "a fresh model differs, so equality below means something"
    assert out["loaded"] == results[0]["at_capture"]
    assert out["meta"] == [2, 2]


def test_two_ranks_to_two_ranks_of_the_other_strategy(
    model_dir: str, saved_by_two: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    policy, results = saved_by_two
    out = run_ranks(load_ranks, 2, model_dir, "ddp", str(policy), merged(results), tmp=tmp_path)
    assert out[0]["loaded"] == results[0]["at_capture"]


def test_one_rank_to_two_fsdp_ranks(model_dir: str, saved_by_one: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    policy, result = saved_by_one
    assert set(result["files"]) >= {"__0_0.distcp", ".metadata"}
    out = run_ranks(load_ranks, 2, model_dir, "fsdp", str(policy), result["files"], tmp=tmp_path)
    assert out[0]["loaded"] == result["at_capture"]
    assert out[0]["meta"] == [2, 1]


def test_a_capture_never_overwrites_a_buffer_still_being_written(model_dir: str) -> None:
    trainer = HFTrainer(settings(model_dir, "ddp"), 0, 1, CPU)
    trainer.capture()
    first_slot, _ = trainer._captured  # type: ignore[misc]
    with trainer.buffers.writing(first_slot):
        trainer.capture()  # the other buffer: fine
        with pytest.raises(RuntimeError, match="two saves in flight"):
            trainer.capture()


# ------------------------------------------------------------------------------------------------ verified reads
def _copy_policy(src: Path, dst: Path) -> Path:
    import shutil

    return Path(shutil.copytree(src, dst))


def test_a_changed_metadata_is_refused_before_it_is_unpickled(
    model_dir: str, saved_by_one: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    src, result = saved_by_one
    policy = _copy_policy(src, tmp_path / "policy")
    marker = tmp_path / "pwned"
    evil = pickle.dumps(ShellPayload(marker))
    (policy / ".metadata").write_bytes(evil)
    trainer = HFTrainer(settings(model_dir, "ddp"), 0, 1, CPU)
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match="blake3 does not match"):
        trainer.load(policy, result["files"])
    forged = {**result["files"], ".metadata": hashlib.sha256(evil).hexdigest()}
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match=r"refers to posix\.system"):
        trainer.load(policy, forged)  # even a forged manifest cannot make the metadata run code
    assert not marker.exists()


def test_files_not_in_the_manifest_are_never_read(model_dir: str, saved_by_one: tuple[Path, dict[str, Any]]) -> None:
    policy, result = saved_by_one
    trainer = HFTrainer(settings(model_dir, "ddp"), 0, 1, CPU)
    partial = {k: v for k, v in result["files"].items() if k != "__0_0.distcp"}
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match="not listed in the bundle manifest"):
        trainer.load(policy, partial)


def test_non_tensor_items_load_weights_only(tmp_path: Path) -> None:
    """A DCP item that is a pickle of a callable: DCP's own planner runs it, ours refuses it."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    policy = tmp_path / "policy"
    meta = {**policy_ckpt.policy_meta(1, "ddp", 1), "version": ShellPayload(marker)}
    dcp.save({"meta": meta}, checkpoint_id=policy, no_dist=True)
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in policy.iterdir()}
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match=r"meta\.version: not plain data"):
        policy_ckpt.read_meta(policy, expected)
    assert not marker.exists()
    dcp.load({"meta": {"version": 0}}, checkpoint_id=policy, no_dist=True)  # control: DCP's default does run it
    assert marker.exists(), "the payload is live, so the refusal above is what kept it from running"


def test_read_meta_names_a_foreign_checkpoint(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    policy = tmp_path / "policy"
    dcp.save({"meta": {**policy_ckpt.policy_meta(1, "ddp", 1), "format": "other"}}, checkpoint_id=policy, no_dist=True)
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in policy.iterdir()}
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match="not an sc-app hf policy checkpoint"):
        policy_ckpt.read_meta(policy, expected)
    dcp.save({"model": {"w": torch.zeros(2)}}, checkpoint_id=tmp_path / "other", no_dist=True)
    other = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (tmp_path / "other").iterdir()}
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match=r"has no 'meta\.format'"):
        policy_ckpt.read_meta(tmp_path / "other", other)
