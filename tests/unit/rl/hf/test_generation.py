"""hf backend: chat template, tasks in token space, and the generate() engine (its log-probs are the trainer's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.rl.hf.chat import encode_prompt, left_pad
from sc_app.rl.hf.dataset import DatasetError, load_jsonl
from sc_app.rl.hf.engine import HFGenerateEngine, SamplingParams, eos_ids
from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.model_dir import check_model_dir, load_model, load_tokenizer
from sc_app.rl.hf.rewards import resolve_reward
from sc_app.rl.hf.tasks import JsonlTask, RepeatFirstTask, response_mask
from tests.support.hf import ARITHMETIC, make_model_dir, write_jsonl


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> Any:
    return load_tokenizer(check_model_dir(model_dir))


@pytest.fixture
def engine(model_dir: Path, tok: Any) -> HFGenerateEngine:
    torch.manual_seed(0)
    model = load_model(check_model_dir(model_dir), torch.float32)
    return HFGenerateEngine(model, eos=eos_ids(model, tok), pad=tok.pad_token_id, device=torch.device("cpu"))


def test_the_chat_template_is_applied_when_the_tokenizer_has_one(tok: Any, tmp_path: Path) -> None:
    with_template = tok.convert_ids_to_tokens(encode_prompt(tok, "what is 3 + 4 ?"))
    assert with_template == ["user", ":", "what", "is", "3", "+", "4", "?", "assistant", ":"]
    plain = make_model_dir(tmp_path / "plain", chat_template=False)
    plain_tok = load_tokenizer(check_model_dir(plain))
    assert plain_tok.convert_ids_to_tokens(encode_prompt(plain_tok, "what is 3 + 4 ?")) == [
        "what", "is", "3", "+", "4", "?"
    ]  # fmt: skip


def test_left_pad() -> None:
    ids, mask = left_pad([[5, 6], [7, 8, 9]], 4, 0)
    assert ids.tolist() == [[0, 0, 5, 6], [0, 7, 8, 9]]
    assert mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    with pytest.raises(ValueError):
        left_pad([[1, 2, 3]], 2, 0)


def test_response_mask_ends_after_the_first_eos() -> None:
    r = torch.tensor([[5, 2, 0, 0], [5, 6, 7, 8], [2, 5, 2, 6]])
    assert response_mask(r, [2]).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


def test_repeat_first_prompts_avoid_special_tokens_and_score_like_the_tiny_task(tok: Any) -> None:
    task = RepeatFirstTask(tok, seed=0, prompt_len=4, response_len=3, dataset_size=1000)
    batch = task.prompts(list(range(50)))
    assert not set(batch.tokens.flatten().tolist()) & set(tok.all_special_ids)
    assert torch.equal(batch.tokens, task.prompts(list(range(50))).tokens), "prompts are a pure function of index"
    first = batch.tokens[:2, :1]
    responses = torch.cat([first.repeat(1, 3)[:1], torch.tensor([[first[1, 0], 2, 0]])])
    rewards = task.rewards([0, 1], responses, response_mask(responses, [2]))
    assert rewards.tolist() == pytest.approx([1.0, 1 / 3])


def test_jsonl_task_scores_decoded_completions_with_the_reward(tok: Any, tmp_path: Path) -> None:
    ds = load_jsonl(write_jsonl(tmp_path / "d.jsonl", ARITHMETIC))
    task = JsonlTask(tok, ds, resolve_reward("numeric_match"), prompt_len=12, response_len=4)
    assert task.check_lengths() == 10
    batch = task.prompts([0, 1])
    assert batch.tokens.shape == (2, 12) and batch.attention_mask[:, :2].sum() == 0
    seven = tok.convert_tokens_to_ids(["7", "</s>", "<pad>", "<pad>"])
    four = tok.convert_tokens_to_ids(["4", "</s>", "7", "7"])  # after eos nothing counts
    responses = torch.tensor([seven, four])
    assert task.rewards([0, 0], responses, response_mask(responses, [2])).tolist() == [1.0, 0.0]


def test_a_prompt_longer_than_prompt_len_names_its_line(tok: Any, tmp_path: Path) -> None:
    ds = load_jsonl(write_jsonl(tmp_path / "d.jsonl", [*ARITHMETIC, {"prompt": "what is " * 20, "answer": "1"}]))
    task = JsonlTask(tok, ds, resolve_reward("exact_match"), prompt_len=12, response_len=4)
    with pytest.raises(DatasetError, match=r"line 7: the prompt is \d+ tokens .* over task.prompt_len=12"):
        task.check_lengths()


def test_generate_returns_fixed_shapes_and_the_trainers_logprobs(engine: HFGenerateEngine, tok: Any) -> None:
    task = RepeatFirstTask(tok, seed=0, prompt_len=4, response_len=6, dataset_size=1000)
    prompts = task.prompts([0, 1, 2])
    out = engine.generate(prompts, 4, SamplingParams(temperature=0.8, max_new_tokens=6))
    assert out.tokens.shape == (12, 10) and out.response_mask.shape == out.logprobs.shape == (12, 6)
    assert torch.equal(out.tokens[:4, :4], prompts.tokens[0].expand(4, 4)), "rows are grouped per prompt"
    again = sequence_logprobs(engine.model, out.tokens, out.attention_mask, 4, 0.8)
    assert torch.allclose(out.logprobs, again, atol=1e-5), "old log-probs = the trainer's function, same weights"
    assert (out.logprobs <= 0).all()


def test_logprobs_match_generates_own_scores_on_left_padded_prompts(engine: HFGenerateEngine, tok: Any) -> None:
    """Independent check of positions under left padding: HF's incremental decoding vs our one forward pass."""
    ids, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12]], 6, tok.pad_token_id)
    torch.manual_seed(1)
    gen = engine.model.generate(
        input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=5, min_new_tokens=5, top_k=0,
        temperature=0.7, pad_token_id=tok.pad_token_id, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    full_mask = torch.cat([mask, torch.ones(2, 5, dtype=mask.dtype)], dim=1)
    ours = sequence_logprobs(engine.model, gen.sequences, full_mask, 6, 0.7)
    theirs = torch.stack([torch.log_softmax(lg.float() / 0.7, -1) for lg in gen.logits], dim=1)
    theirs = theirs.gather(-1, gen.sequences[:, 6:].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_new_weights_change_generation_and_version(engine: HFGenerateEngine, tok: Any) -> None:
    task = RepeatFirstTask(tok, seed=0, prompt_len=4, response_len=4, dataset_size=1000)
    prompts = task.prompts([0])
    weights = {k: torch.zeros_like(v) for k, v in engine.model.state_dict().items()}
    engine.load_weights(weights, 7)
    out = engine.generate(prompts, 2, SamplingParams(max_new_tokens=4))
    assert out.version == 7
    uniform = -torch.log(torch.tensor(float(engine.model.config.vocab_size)))
    assert torch.allclose(out.logprobs, uniform.expand_as(out.logprobs), atol=1e-5), "zero weights: uniform policy"
