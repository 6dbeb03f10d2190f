"""hf backend: a local model directory is checked before transformers loads it; every gap is one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sc_app.rl.hf.model_dir import (
    ModelDirError,
    check_model_dir,
    load_model,
    load_tokenizer,
    model_files,
    resolve_dtype,
)
from tests.support.hf import make_model_dir


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture
def model_dir(pristine: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "m"))


def refused(path: Path) -> str:
    with pytest.raises(ModelDirError) as info:
        check_model_dir(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_a_complete_directory_loads_offline(model_dir: Path) -> None:
    checked = check_model_dir(model_dir)
    assert checked.weights == ("model.safetensors",)
    assert "tokenizer.json" in checked.tokenizer
    model = load_model(checked, torch.float32)
    tok = load_tokenizer(checked)
    assert model.config.vocab_size == len(tok)
    assert next(model.parameters()).dtype == torch.float32
    files = model_files(checked)
    assert "config.json" in files and "tokenizer.json" in files
    assert not any(name.endswith(".safetensors") for name in files), "weights are never copied as 'model files'"


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: shutil.rmtree(d), "does not exist"),
        (lambda d: (shutil.rmtree(d), d.write_text("x")), "is not a directory"),
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json is not valid JSON"),
        (lambda d: (d / "config.json").write_text("{}"), "names no model_type"),
        (lambda d: (d / "model.safetensors").unlink(), "no weights"),
        (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors is empty"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer file"),
    ],
    ids=["missing", "file", "no-config", "bad-config", "config-no-type", "no-weights", "empty-weights", "no-tok"],
)
def test_every_gap_is_one_line_naming_it(model_dir: Path, damage, named: str) -> None:  # type: ignore[no-untyped-def]
    damage(model_dir)
    assert named in refused(model_dir)


def test_pickled_weights_are_refused_not_loaded(model_dir: Path) -> None:
    (model_dir / "model.safetensors").rename(model_dir / "pytorch_model.bin")
    assert "pickled .bin" in refused(model_dir)


def test_a_sharded_index_needs_every_shard(model_dir: Path) -> None:
    (model_dir / "model.safetensors").rename(model_dir / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "model-00002-of-00002.safetensors" in refused(model_dir)


def test_remote_code_is_never_trusted(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.X"}
    (model_dir / "config.json").write_text(json.dumps(cfg))
    assert "auto_map" in refused(model_dir)


def test_a_truncated_weight_file_fails_in_one_line_at_load(model_dir: Path) -> None:
    data = (model_dir / "model.safetensors").read_bytes()
    (model_dir / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelDirError) as info:
        load_model(check_model_dir(model_dir), torch.float32)
    assert "\n" not in str(info.value) and "cannot load the model" in str(info.value)


def test_dtype_auto_is_float32_on_cpu_bfloat16_on_gpu() -> None:
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ValueError, match=r"model\.dtype"):
        resolve_dtype("int8", "cpu")


def test_a_corrupt_tokenizer_fails_in_one_line_at_load(model_dir: Path) -> None:
    (model_dir / "tokenizer.json").write_text('{"version": "1.0", "model": 42}')
    with pytest.raises(ModelDirError) as info:
        load_tokenizer(check_model_dir(model_dir))
    assert "\n" not in str(info.value) and "cannot load the tokenizer" in str(info.value)
