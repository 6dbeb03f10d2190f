"""Model, tokenizer and engine that do not fit each other are refused before Ray starts (issue 31, class F): one
line naming the key, the values and what to do, exit 2, no lease — ``sc-app run`` in this process (the ``cli``
fixture) on tiny Llama models built here. Each relation is a case: the vocab against the tokenizer, the special ids
(the tokenizer's, ``config.json``'s, ``generation_config.json``'s), ``generation.max_model_len`` against the
context vLLM derives (position keys, ``tokenizer_config.json``'s ``model_max_length``, a RoPE factor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint.lease import LEASE_FILE
from sc_app.rl.hf.model_fit import context_limit
from sc_app.rl.hf.random_model import vocabulary
from tests.support.cli import InProcess
from tests.support.hf import make_model_dir

VOCAB = len(vocabulary())


def _edit(path: Path, **changes: Any) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**doc, **changes}))


def _model(root: Path, case: str) -> Path:
    """A tiny model directory with the one mismatch ``case`` names."""
    if case == "vocab below the tokenizer":
        return make_model_dir(root, vocab_size=VOCAB - 3)
    model = make_model_dir(root)
    if case == "eos in config.json":
        _edit(model / "config.json", eos_token_id=VOCAB + 5)
    elif case == "eos list in generation_config.json":
        _edit(model / "generation_config.json", eos_token_id=[2, VOCAB])
    elif case == "tokenizer model_max_length":
        _edit(model / "tokenizer_config.json", model_max_length=24)
    return model


CASES = {  # case → extra settings, the words the one line must hold
    "vocab below the tokenizer": ([], [f"its tokenizer has {VOCAB} tokens but the model's vocab_size is {VOCAB - 3}"]),
    "eos in config.json": ([], [f"eos_token_id in config.json is {VOCAB + 5}", f"vocab_size {VOCAB}"]),
    "eos list in generation_config.json": ([], [f"eos_token_id in generation_config.json is {VOCAB}"]),
    "max_model_len over the context": (
        ["generation.engine=vllm", "generation.max_model_len=256"],
        [
            "generation.max_model_len=256 exceeds the 128 positions",
            "max_position_embeddings in config.json",
            "set generation.max_model_len to at most 128",
        ],
    ),
    "tokenizer model_max_length": (
        ["generation.engine=vllm", "generation.max_model_len=32"],
        ["generation.max_model_len=32 exceeds the 24 positions", "model_max_length in tokenizer_config.json"],
    ),
}


def run_argv(model: Path, ckpt: Path, *sets: str) -> list[str]:
    args = ["run", "--checkpoint-dir", str(ckpt), "--max-steps", "2"]
    for s in ["model.backend=hf", f"model.path={model}", "task.prompt_len=8", "task.response_len=4", *sets]:
        args += ["--set", s]
    return args


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_model_engine_mismatch_is_one_line_before_ray(cli: InProcess, tmp_path: Path, case: str) -> None:
    sets, named = CASES[case]
    ckpt = tmp_path / "ck"
    result = cli(*run_argv(_model(tmp_path / "model", case), ckpt, *sets))
    errors = [line for line in result.stderr.splitlines() if line.startswith("sc-app: error:")]
    assert result.rc == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert len(errors) == 1 and all(n in errors[0] for n in named), errors
    assert "Traceback" not in result.stderr and "ValidationError" not in result.stderr
    assert not (ckpt / LEASE_FILE).exists(), "refused before the lease is taken (and before Ray)"


@pytest.mark.parametrize(
    ("config", "tokenizer_config", "limit"),
    [
        ({"max_position_embeddings": 128}, {}, 128),
        ({"max_position_embeddings": 4096, "n_positions": 2048}, {}, 2048),  # the smallest key wins
        ({"max_position_embeddings": 128}, {"model_max_length": 64}, 64),
        ({"max_position_embeddings": 128}, {"model_max_length": 10**30}, 128),  # transformers' "no limit"
        ({"max_position_embeddings": 128, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, {}, 512),
        ({"max_position_embeddings": 128, "rope_scaling": {"type": "dynamic", "factor": 2}}, {}, 256),
        ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, {}, 8192),
        ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, {}, 4096),
        ({"text_config": {"max_position_embeddings": 256}}, {}, 256),
        ({}, {}, None),
    ],
)
def test_the_context_vllm_derives(config: dict[str, Any], tokenizer_config: dict[str, Any], limit: int | None) -> None:
    got = context_limit(config, tokenizer_config)
    assert (got[0] if got else None) == limit
