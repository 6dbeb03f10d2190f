"""What an hf-backend run checks before Ray starts, so bad input is one line and exit 2, not a dead worker.

``check_inputs``: the model directory (and that prompt + response fit its context), the model, its tokenizer and
the generation engine against each other (``sc_app.rl.hf.model_fit``), and for ``task.name=jsonl``
the dataset (every line), the reward function (importable, callable with the keywords) and every prompt's length
after the chat template. Returns the dataset's record (path, sha256 of its bytes, rows) that bundles carry.
"""

from __future__ import annotations

from dataclasses import dataclass

from sc_app.checkpoint.dataset import DatasetRecord
from sc_app.config.app import AppConfig
from sc_app.rl.hf.dataset import load_jsonl
from sc_app.rl.hf.model_dir import ModelDir, ModelDirError, check_model_dir, load_tokenizer
from sc_app.rl.hf.model_fit import check_fit
from sc_app.rl.hf.reward_probe import probe_reward
from sc_app.rl.hf.rewards import resolve_reward
from sc_app.rl.hf.weights_check import check_weights


@dataclass(frozen=True)
class CheckedInputs:
    model: ModelDir
    dataset: DatasetRecord | None  # None for repeat_first


def check_inputs(cfg: AppConfig) -> CheckedInputs:
    """Pre: ``cfg.model.backend == "hf"``. Raises an ``HFInputError`` (one line) naming the first problem."""
    assert cfg.model.path is not None
    model = check_model_dir(cfg.model.path)
    check_weights(model)  # every header readable, the tensors exactly the model's: never a random init
    seq = cfg.task.prompt_len + cfg.task.response_len
    if model.max_positions is not None and seq > model.max_positions:
        raise ModelDirError(
            f"task.prompt_len + task.response_len = {seq} exceeds the model's context of {model.max_positions} "
            f"positions ({model.path}/config.json); lower them"
        )
    tokenizer = load_tokenizer(model)
    check_fit(cfg, model, tokenizer)  # tokenizer ids in the vocab, generation.max_model_len in the context
    if cfg.task.name != "jsonl":
        return CheckedInputs(model, None)
    assert cfg.task.path is not None
    from sc_app.rl.hf.tasks import JsonlTask

    dataset = load_jsonl(cfg.task.path, shuffle=cfg.task.shuffle, seed=cfg.run.seed)
    probe_reward(cfg.task.reward)  # the module's import runs in a child first: an exit or a hang there is one line
    reward = resolve_reward(cfg.task.reward)
    task = JsonlTask(tokenizer, dataset, reward, prompt_len=cfg.task.prompt_len, response_len=cfg.task.response_len)
    task.check_lengths()
    return CheckedInputs(model, DatasetRecord.of(dataset))


def checked_dataset(cfg: AppConfig) -> DatasetRecord | None:
    """``check_inputs`` as the generic path calls it (``sc_app.rl.hooks.INPUT_CHECKS``): the dataset record."""
    return check_inputs(cfg).dataset


def dataset_now(cfg: AppConfig) -> DatasetRecord:
    """The jsonl task's dataset file as it is now (``DatasetError``), without the model checks: what
    ``sc-app preflight`` compares with the bundle it would resume (``sc_app.rl.hooks.TASK_DATASETS``)."""
    assert cfg.task.path is not None
    return DatasetRecord.of(load_jsonl(cfg.task.path, shuffle=cfg.task.shuffle, seed=cfg.run.seed))
