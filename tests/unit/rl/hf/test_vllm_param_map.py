"""The param map's rules on a stand-in with vLLM's layout (fused q/k/v and gate/up with ``output_sizes``, a padded
vocabulary, a tied output projection, the model's name mapper): where each trainer tensor lands, and every layout it
refuses rather than guess. The real engine (its packed CPU kernels, byte equality with vLLM's own reload, the
fallback): tests/integration/rl/hf/test_vllm_engine.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from sc_app.rl.hf.vllm_param_map import Unmapped, build

STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
           ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}  # fmt: skip
H, Q, KV, FFN, VOCAB, PADDED = 4, 4, 2, 6, 5, 8


class Mapper:
    """vLLM's ``WeightsMapper`` contract: a Hugging Face name → (the vLLM name, its shard id or None)."""

    def _map_name_with_shard(self, key: str) -> tuple[str, Any] | None:
        for old, (new, shard) in STACKED.items():
            if old in key:
                return key.replace(old, new), shard
        return key, None


def layer(rows: int, cols: int, **attrs: Any) -> nn.Module:
    m = nn.Module()
    m.weight = nn.Parameter(torch.zeros(rows, cols), requires_grad=False)
    for k, v in attrs.items():
        setattr(m, k, v)
    return m


def engine_model() -> nn.Module:
    model, inner, block, attn, mlp = nn.Module(), nn.Module(), nn.Module(), nn.Module(), nn.Module()
    inner.embed_tokens = layer(PADDED, H, org_vocab_size=VOCAB)
    attn.qkv_proj = layer(Q + 2 * KV, H, output_sizes=[Q, KV, KV])
    mlp.gate_up_proj = layer(2 * FFN, H, output_sizes=[FFN, FFN])
    block.self_attn, block.mlp = attn, mlp
    inner.layers = nn.ModuleList([block])
    inner.norm = nn.Module()
    inner.norm.weight = nn.Parameter(torch.zeros(H), requires_grad=False)
    inner.norm.scale = nn.Parameter(torch.zeros(()), requires_grad=False)  # a scalar parameter
    model.model = inner
    model.lm_head = layer(PADDED, H, org_vocab_size=VOCAB)
    model.lm_head.weight = inner.embed_tokens.weight  # tied, as vLLM ties them
    model.hf_to_vllm_mapper = Mapper()
    return model


def config(tied: bool = True, tp: int = 1, quantization: str | None = None) -> Any:
    return SimpleNamespace(
        model_config=SimpleNamespace(quantization=quantization, hf_config=SimpleNamespace(tie_word_embeddings=tied)),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1),
        lora_config=None,
    )


def trainer_state(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (VOCAB, H), "model.layers.0.self_attn.q_proj.weight": (Q, H),
              "model.layers.0.self_attn.k_proj.weight": (KV, H), "model.layers.0.self_attn.v_proj.weight": (KV, H),
              "model.layers.0.mlp.gate_proj.weight": (FFN, H), "model.layers.0.mlp.up_proj.weight": (FFN, H),
              "model.norm.weight": (H,), "model.norm.scale": (),
              "model.layers.0.self_attn.rotary_emb.inv_freq": (2,)}  # fmt: skip
    state = {k: torch.randn(s, generator=gen, dtype=torch.float64).to(dtype) for k, s in shapes.items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # HF's tied state dict names it twice
    return state


def test_each_trainer_tensor_lands_in_its_rows_of_the_engines_own_parameter() -> None:
    model, state = engine_model(), trainer_state(torch.float64)  # the trainer's dtype is not the engine's
    qkv = model.model.layers[0].self_attn.qkv_proj.weight
    address = qkv.data_ptr()
    model.model.embed_tokens.weight.data.fill_(7)  # padding rows hold garbage: vLLM's loader leaves zeros
    pmap = build(model, config(), state)
    pmap.load(state)
    f32 = {k: v.float() for k, v in state.items()}
    assert torch.equal(qkv[:Q], f32["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(qkv[Q : Q + KV], f32["model.layers.0.self_attn.k_proj.weight"])
    assert torch.equal(qkv[Q + KV :], f32["model.layers.0.self_attn.v_proj.weight"])
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(gate_up[FFN:], f32["model.layers.0.mlp.up_proj.weight"])
    emb = model.model.embed_tokens.weight
    assert torch.equal(emb[:VOCAB], f32["model.embed_tokens.weight"]) and not emb[VOCAB:].any()
    assert model.lm_head.weight is emb and torch.equal(model.model.norm.weight, f32["model.norm.weight"])
    assert torch.equal(model.model.norm.scale, f32["model.norm.scale"])
    assert qkv.data_ptr() == address and qkv.dtype == torch.float32, "in place, in the engine's dtype"
    assert sorted(pmap.dropped) == ["lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"]
    assert not any(t.packed for t in pmap.targets), "live parameters: no staging"


@pytest.mark.parametrize(
    ("change", "cfg", "why"),
    [
        (lambda s: s.pop("model.layers.0.self_attn.k_proj.weight"), {}, r"rows 4-6 of .*qkv_proj.weight"),
        (lambda s: s.pop("model.norm.weight"), {}, r"model.norm.weight: no trainer tensor"),
        (lambda s: s.update({"model.extra.weight": torch.zeros(1)}), {}, r"model.extra.weight .*no parameter"),
        (lambda s: s.update({"model.norm.weight": torch.zeros(H + 1)}), {}, r"does not match model.norm.weight"),
        (lambda s: s.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(FFN + 1, H)}), {}, r"shard 1"),
        (lambda s: None, {"tp": 2}, r"tensor_parallel_size=2"),
        (lambda s: None, {"quantization": "fp8"}, r"quantization fp8"),
        (lambda s: None, {"tied": False}, r"lm_head.weight .*no parameter"),
    ],
)
def test_a_layout_the_map_cannot_explain_is_refused_in_one_line(change: Any, cfg: dict[str, Any], why: str) -> None:
    state = trainer_state()
    change(state)
    with pytest.raises(Unmapped, match=why) as info:
        build(engine_model(), config(**cfg), state)
    assert "\n" not in str(info.value)


def test_a_model_without_a_name_mapper_is_refused() -> None:
    model = engine_model()
    del model.hf_to_vllm_mapper
    with pytest.raises(Unmapped, match="declares no hf_to_vllm_mapper"):
        build(model, config(), trainer_state())
