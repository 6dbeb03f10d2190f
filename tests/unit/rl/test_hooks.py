"""sc_app.rl.hooks: what the generic path asks a backend or task, resolved by name — every registered target
exists, the jsonl task's dataset record is the file's bytes, and its problems reach the caller as the types the
generic path knows (``DatasetUnusable``, ``InputError``, ``ExportFailed``)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sc_app.checkpoint.dataset import DatasetUnusable
from sc_app.config.app import AppConfig, load_config
from sc_app.rl import hooks
from sc_app.rl.hf.errors import HFInputError


@pytest.mark.parametrize(
    "target", [*hooks.INPUT_CHECKS.values(), *hooks.TASK_DATASETS.values(), *hooks.EXPORTERS.values()]
)
def test_every_registered_hook_exists(target: str) -> None:
    table = {"x": target}
    assert callable(hooks._resolve(table, "x"))


def jsonl_config(path: Path) -> AppConfig:
    return load_config(
        None,
        ["model.backend=hf", "model.path=/models/unused", "task.name=jsonl", f"task.path={path}", "task.shuffle=false"],
    )


def test_the_jsonl_tasks_dataset_is_its_files_bytes(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in range(3)))
    record = hooks.current_dataset(jsonl_config(data))
    assert record is not None
    assert (record.path, record.rows) == (str(data), 3)
    assert record.sha256 == hashlib.sha256(data.read_bytes()).hexdigest()


def test_an_unreadable_dataset_is_one_line_the_selection_understands(tmp_path: Path) -> None:
    with pytest.raises(DatasetUnusable) as info:
        hooks.current_dataset(jsonl_config(tmp_path / "missing.jsonl"))
    assert "no such file" in str(info.value) and "\n" not in str(info.value)


def test_a_task_or_backend_without_an_entry_has_nothing_to_check() -> None:
    cfg = load_config()
    assert cfg.task.name == "repeat_first" and cfg.model.backend == "tiny"
    assert hooks.current_dataset(cfg) is None
    assert hooks.check_inputs(cfg) is None
    assert not hooks.can_export("tiny") and hooks.can_export("hf")


def test_a_backends_input_error_is_an_input_error() -> None:
    assert issubclass(HFInputError, hooks.InputError)


def test_an_export_problem_is_an_export_failed(tmp_path: Path) -> None:
    occupied = tmp_path / "out"
    occupied.mkdir()
    (occupied / "x").write_text("taken")
    with pytest.raises(hooks.ExportFailed) as info:
        hooks.export_policy("hf", tmp_path / "policy", {"hf/config.json": "0" * 64}, occupied)
    assert "not an empty directory" in str(info.value)
