"""A tiny random-initialised Hugging Face causal LM and its tokenizer, built locally (never downloaded).

For tests, benchmarks and smoke runs: a Llama-architecture model with a word-level tokenizer (built with
``tokenizers``) over digits, a few words and the special tokens, with a chat template. ``python -m
sc_app.rl.hf.random_model OUT_DIR`` writes one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
WORDS = ("what", "is", "+", "-", "*", "=", "?", "the", "answer", "user", "assistant", ":")
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)


@dataclass(frozen=True)
class RandomModelSpec:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = True
    chat_template: bool = True
    seed: int = 0
    vocab_size: int | None = None  # None: the tokenizer's (a smaller one: a model its tokenizer does not fit)


def vocabulary() -> dict[str, int]:
    tokens = [*SPECIAL_TOKENS, *(str(d) for d in range(10)), *WORDS]
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(chat_template: bool = True):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocabulary(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)]
    )
    tok.decoder = decoders.WordPiece(prefix="##")  # word-level: decoded tokens joined by spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def write_random_model(out: str | Path, spec: RandomModelSpec = RandomModelSpec()) -> Path:
    """Write config, safetensors weights, tokenizer (and chat template) into ``out``; returns it."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = vocabulary()
    cfg = LlamaConfig(
        vocab_size=spec.vocab_size or len(vocab),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(out)
    build_tokenizer(spec.chat_template).save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="directory to write (created)")
    p.add_argument("--no-chat-template", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print(write_random_model(a.out, RandomModelSpec(chat_template=not a.no_chat_template, seed=a.seed)))


if __name__ == "__main__":
    main()
