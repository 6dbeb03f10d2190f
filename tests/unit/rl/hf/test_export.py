"""hf backend: a saved policy exported in Hugging Face layout loads with from_pretrained and gives the trainer's
logits; the export reads only verified bytes and leaves no half-written directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.io import hashing
from sc_app.rl.hf import policy_ckpt
from sc_app.rl.hf.export import ExportError, export_policy
from sc_app.rl.hf.logprobs import position_ids
from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings
from tests.support.hf import make_model_dir

CPU = torch.device("cpu")
INPUT = torch.tensor([[1, 20, 15, 8, 9, 10, 11], [0, 0, 5, 6, 7, 8, 9]])
MASK = torch.tensor([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])


def logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT, attention_mask=MASK, position_ids=position_ids(MASK)).logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], torch.Tensor, Path]:
    root = tmp_path_factory.mktemp("export")
    model_dir = make_model_dir(root / "model")
    trainer = HFTrainer(TrainerSettings(str(model_dir), learning_rate=5e-2, prompt_len=3), 0, 1, CPU)
    tokens = torch.randint(4, 20, (4, 7), generator=torch.Generator().manual_seed(0))
    ones = torch.ones_like(tokens)
    batch = TrainBatch(tokens, ones, torch.ones(4, 4, dtype=torch.long), torch.full((4, 4), -3.0), torch.randn(4))
    trainer.train_step(batch, 1)
    trainer.capture()
    policy = root / "policy"
    policy.mkdir()
    written = trainer.write_captured(policy)
    trained = logits(trainer.hf_model)
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(model_dir)
    assert not torch.allclose(logits(original), trained), "the step changed the model, so equality below matters"
    return policy, {n: hashing.label(r.alg, r.digest) for n, r in written.files.items()}, trained, model_dir


def test_from_pretrained_on_the_export_gives_the_trainers_logits(saved: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy, expected, trained, model_dir = saved
    result = export_policy(policy, expected, tmp_path / "out")
    assert "model.safetensors" in result.files and "config.json" in result.files and "tokenizer.json" in result.files
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.equal(logits(model), trained)
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert tok.chat_template == AutoTokenizer.from_pretrained(model_dir).chat_template
    assert (
        tok("what is 3 + 4 ?")["input_ids"] == AutoTokenizer.from_pretrained(model_dir)("what is 3 + 4 ?")["input_ids"]
    )
    assert result.dtype == "float32" and result.parameters == sum(p.numel() for p in model.parameters())


def test_an_existing_output_is_never_overwritten(saved: Any, tmp_path: Path) -> None:
    policy, expected, _, _ = saved
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(ExportError, match="not an empty directory"):
        export_policy(policy, expected, out)
    assert (out / "keep.txt").read_text() == "mine"


@pytest.mark.parametrize("victim", ["hf/config.json", "__0_0.distcp"])
def test_a_changed_file_stops_the_export_and_leaves_nothing(saved: Any, tmp_path: Path, victim: str) -> None:
    policy, expected, _, _ = saved
    copy = Path(shutil.copytree(policy, tmp_path / "policy"))
    data = bytearray((copy / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / victim).write_bytes(bytes(data))
    assert not hashing.bytes_match(bytes(data), expected[victim])
    with pytest.raises(policy_ckpt.PolicyIntegrityError, match="blake3 does not match"):
        export_policy(copy, expected, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial")]


def test_two_exports_racing_to_one_out_leave_one_complete_export_and_one_error(saved: Any, tmp_path: Path) -> None:
    import threading

    from transformers import AutoModelForCausalLM

    policy, expected, trained, _ = saved
    out = tmp_path / "out"
    results: list[object] = []

    def export() -> None:
        try:
            results.append(export_policy(policy, expected, out))
        except ExportError as exc:
            results.append(exc)

    threads = [threading.Thread(target=export) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    errors = [r for r in results if isinstance(r, ExportError)]
    assert len(results) == 2 and len(errors) == 1, results
    assert "\n" not in str(errors[0]) and "--out" in str(errors[0])
    assert torch.equal(logits(AutoModelForCausalLM.from_pretrained(out)), trained)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "no partial directory is left behind"
