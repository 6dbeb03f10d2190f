"""The vLLM generation engine (``generation.engine: vllm``): one ``vllm.LLM`` per generation worker, behind
``engine.GenerationEngine``.

The engine core runs **in the worker's own process** (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), not in a child that
vLLM spawns: the Ray actor already is a dedicated process, so a second one only adds a start-up, a copy of every
request and every weights version across a socket, and a process Ray does not know about (it would outlive a
SIGKILLed actor and hold the memory or GPU). In-process, a start-up failure is an exception in ``setup`` (one line,
exit 2), weights reach the model runner by reference, and the actor's serial calls are what keeps one
weights version per generate call. Tensor parallelism (``tensor_parallel_size > 1``, GPU) still starts one
executor process per extra GPU (vLLM's ``mp`` backend).

Sampling: vLLM's own ``SamplingParams`` — temperature, top-k, top-p, ``max_tokens``, ``n`` = the group size, the
eos ids as stop tokens, and a seed per request derived from ``run.seed``, the prompt index and the weights version
(``request_seed``): a resumed run issues the same prompts at the same versions and so draws the same random
numbers as an uninterrupted one.

Log-probs (``grpo.old_logprobs``): ``trainer`` runs the trainer's own function (``logprobs.sequence_logprobs``) on a
Hugging Face copy of the same weights version in this worker — the importance ratio of a fresh row is exactly 1;
``engine`` takes vLLM's sampled-token log-probs after temperature (``processed_logprobs``; under top-k/top-p they
are of the truncated distribution that actually sampled), saving that forward pass and the copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sc_app.rl.hf.engine import GenerationOutput, SamplingParams
from sc_app.rl.hf.engine_cache import EngineCache, cache_key, prepare, publish
from sc_app.rl.hf.errors import HFInputError
from sc_app.rl.hf.logprobs import sequence_logprobs
from sc_app.rl.hf.tasks import PromptBatch, response_mask
from sc_app.rl.hf.vllm_weights import EXTENSION_CLS
from sc_app.rl.weight_sync.base import WeightReceiver

log = logging.getLogger(__name__)

# set in the worker before vLLM reads them (setdefault: an operator's own value wins)
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process (module docstring)
    "VLLM_LOGGING_LEVEL": "WARNING",
}
CPU_KV_CACHE_GIB = "1"  # VLLM_CPU_KVCACHE_SPACE when unset: vLLM's CPU default takes a share of the host's memory


class VLLMStartError(HFInputError):
    """vLLM cannot serve the configured model (head_dim, memory, architecture, ...); ``str()`` is one line."""


@dataclass(frozen=True)
class VLLMSettings:
    model_path: str
    dtype: str  # "float32" | "bfloat16" | "float16"
    seed: int  # run.seed
    max_model_len: int
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.7
    engine_logprobs: bool = False  # grpo.old_logprobs == "engine"
    on_gpu: bool = False
    cache_root: str | None = None  # <checkpoint.dir>/engine_cache (engine_cache.py); None: no compile cache kept
    cache_max_gib: float = 4.0


def request_seed(run_seed: int, prompt_index: int, version: int) -> int:
    """The seed of one prompt's request at one weights version (vLLM gives sample ``k`` of it ``seed + k``)."""
    digest = hashlib.blake2b(f"sc-app/vllm/{run_seed}/{prompt_index}/{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2  # < 2**62: room for + k


def _hint(cause: str) -> str:
    low = cause.lower()
    if "head_dim" in low or "head size" in low:
        return "vLLM's attention kernels do not support this head size (CPU: 64 works); use generation.engine=hf"
    if "memory" in low or "kv cache" in low or "cache blocks" in low:
        return (
            "give the engine more memory (GPU: generation.gpu_memory_utilization; CPU: VLLM_CPU_KVCACHE_SPACE GiB) "
            "or lower generation.max_model_len"
        )
    if "architecture" in low or "not supported" in low:
        return "vLLM does not support this model; use generation.engine=hf"
    return "see docs/vllm.md, or use generation.engine=hf"


def _cause(exc: BaseException) -> str:
    """The innermost exception's first line (vLLM wraps its start-up errors)."""
    inner: BaseException = exc
    seen = {id(exc)}
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    for candidate in (inner, exc):
        lines = str(candidate).strip().splitlines()
        if lines:
            return f"{type(candidate).__name__}: {lines[0]}"
    return type(exc).__name__


def _smoke(llm: Any) -> None:
    """One token of one request: some kernels (e.g. CPU attention for an unsupported head size) are first chosen
    at the first forward, and start-up is where a refusal belongs, not the first rollout."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    llm.generate([TokensPrompt(prompt_token_ids=[0])], VSamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)


def start_llm(settings: VLLMSettings) -> Any:
    """A running ``vllm.LLM`` for ``settings``; ``VLLMStartError`` (one line: model and cause) if it cannot start."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
    if not settings.on_gpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
    t0 = time.perf_counter()
    try:
        cache = _engine_cache(settings)
    except Exception as exc:  # the compile cache never stops an engine
        log.warning("engine cache off for this start (%s: %s): cold start", type(exc).__name__, exc)
        cache = None
    try:
        from vllm import LLM

        llm = LLM(
            model=settings.model_path,
            dtype=settings.dtype,
            seed=settings.seed,
            max_model_len=settings.max_model_len,
            tensor_parallel_size=settings.tensor_parallel_size,
            distributed_executor_backend="mp" if settings.tensor_parallel_size > 1 else None,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=not settings.on_gpu,  # CPU: no graph capture to gain from; GPU: CUDA graphs
            skip_tokenizer_init=True,  # token ids in, token ids out: the task owns the tokenizer
            worker_extension_cls=EXTENSION_CLS,
            logprobs_mode="processed_logprobs",
        )
        _smoke(llm)
    except Exception as exc:
        cause = _cause(exc)
        raise VLLMStartError(
            f"generation.engine=vllm cannot start model {settings.model_path}: {cause}; {_hint(cause)}"
        ) from None
    if cache is not None and not cache.warm:
        try:
            publish(cache.cache, cache.private)
        except Exception as exc:  # publish reports the volume's errors itself; anything else is one line too
            log.warning("engine cache not kept (%s: %s)", type(exc).__name__, exc)
    seconds = time.perf_counter() - t0
    state = "off" if cache is None else ("warm" if cache.warm else "cold")
    log.info("vLLM engine for %s started in %.1f s (compile cache: %s)", settings.model_path, seconds, state)
    llm.sc_app_start = StartRecord(seconds, state)
    return llm


@dataclass(frozen=True)
class StartRecord:
    seconds: float
    cache: str  # "warm" | "cold" | "off"


@dataclass(frozen=True)
class _Cache:
    cache: EngineCache
    private: Path
    warm: bool


_CACHE_ENV = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
_set_by_us: set[str] = set()  # the cache roots this process set (a second engine replaces them; an operator's stay)


def _engine_cache(settings: VLLMSettings) -> _Cache | None:
    """The engine's private cache directory, a copy of the published one where there is one (``engine_cache``),
    pointed to by vLLM's, inductor's and Triton's cache variables; None when off or the operator set
    ``VLLM_CACHE_ROOT`` (their value wins)."""
    current = os.environ.get("VLLM_CACHE_ROOT")
    if settings.cache_root is None or (current is not None and current not in _set_by_us):
        return None
    import platform

    import vllm

    if settings.on_gpu:
        major, minor = torch.cuda.get_device_capability()
        device = f"cuda:{torch.cuda.get_device_name()}:sm{major}{minor}"
    else:
        device = f"cpu:{platform.machine()}:{torch.backends.cpu.get_cpu_capability()}"
    engine = {
        "dtype": settings.dtype,
        "max_model_len": settings.max_model_len,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enforce_eager": not settings.on_gpu,
    }
    versions = {"vllm": vllm.__version__, "torch": torch.__version__}
    cache = EngineCache(
        Path(settings.cache_root),
        cache_key(settings.model_path, engine, versions, device),
        int(settings.cache_max_gib * 2**30),
    )
    private, warm = prepare(cache)  # OSError: no private directory (local disk full or read-only)
    for key, sub in zip(_CACHE_ENV, ("", "inductor", "triton"), strict=True):
        os.environ[key] = str(private / sub) if sub else str(private)
    _set_by_us.add(str(private))
    return _Cache(cache, private, warm)


class VLLMEngine:
    """``GenerationEngine`` on a running ``vllm.LLM``. ``receiver``: how a weights payload lands in the engine's
    workers (the run's weight transport, ``sc_app.rl.weight_sync``). ``logprob_model``: the Hugging Face copy that
    computes the trainer's log-probs (None with ``engine_logprobs``)."""

    def __init__(
        self,
        llm: Any,
        settings: VLLMSettings,
        *,
        receiver: WeightReceiver,
        eos: list[int],
        pad: int,
        logprob_model: Any = None,
    ) -> None:
        if logprob_model is None and not settings.engine_logprobs:
            raise ValueError("grpo.old_logprobs=trainer needs the Hugging Face copy of the model (logprob_model)")
        self.llm, self.settings, self.receiver = llm, settings, receiver
        self.eos, self.pad = list(eos), pad
        self.logprob_model = logprob_model.eval() if logprob_model is not None else None
        self.version = 0
        self.last_sync_seconds = 0.0

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """``weights`` (the transport's payload) into the running engine in place (no file), then ``version`` is
        served; the log-prob copy, if any, gets the same state dict."""
        t0 = time.perf_counter()
        received = self.receiver.receive(self.llm, weights)
        # KV blocks cached under the last version must not serve a prompt prefix of this one
        self.llm.reset_prefix_cache()
        if self.logprob_model is not None:
            self.logprob_model.load_state_dict(received.host_state(), strict=True)
        self.version = version
        self.last_sync_seconds = time.perf_counter() - t0
        log.info(
            "vLLM engine serves weights version %d (%d tensors, %.3f s)",
            version,
            received.tensors,
            self.last_sync_seconds,
        )

    def sampling_params(self, prompt_index: int, num_samples: int, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VSamplingParams

        return VSamplingParams(
            n=num_samples,
            temperature=params.temperature,
            top_k=params.top_k,  # 0: off, as in ours
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            seed=request_seed(self.settings.seed, prompt_index, self.version),
            stop_token_ids=self.eos,
            logprobs=0 if self.settings.engine_logprobs else None,  # 0: the sampled token's only
            detokenize=False,
        )

    @torch.no_grad()
    def generate(self, prompts: PromptBatch, num_samples: int, params: SamplingParams) -> GenerationOutput:
        from vllm.inputs import TokensPrompt

        version = self.version
        requests = [
            TokensPrompt(prompt_token_ids=row[mask.bool()].tolist())
            for row, mask in zip(prompts.tokens, prompts.attention_mask, strict=True)
        ]
        sampling = [self.sampling_params(i, num_samples, params) for i in prompts.indices]
        outs = self.llm.generate(requests, sampling, use_tqdm=False)
        if self.version != version:  # the actor is serial: a load cannot land mid-call
            raise RuntimeError(f"weights version changed from {version} to {self.version} during a generate call")
        width = params.max_new_tokens
        n = len(requests) * num_samples
        responses = torch.full((n, width), self.pad, dtype=torch.long)
        engine_lp = torch.zeros((n, width), dtype=torch.float32)
        for i, out in enumerate(outs):
            if len(out.outputs) != num_samples:
                raise RuntimeError(f"vLLM returned {len(out.outputs)} samples for a request of n={num_samples}")
            for k, sample in enumerate(sorted(out.outputs, key=lambda s: s.index)):
                ids = list(sample.token_ids)[:width]
                responses[i * num_samples + k, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                if self.settings.engine_logprobs:
                    values = [step[t].logprob for step, t in zip(sample.logprobs or [], ids, strict=False)]
                    engine_lp[i * num_samples + k, : len(values)] = torch.tensor(values, dtype=torch.float32)
        return self._output(prompts, num_samples, params, responses, engine_lp, version)

    def _output(
        self,
        prompts: PromptBatch,
        num_samples: int,
        params: SamplingParams,
        responses: torch.Tensor,
        engine_lp: torch.Tensor,
        version: int,
    ) -> GenerationOutput:
        tokens = prompts.tokens.repeat_interleave(num_samples, dim=0)
        mask = prompts.attention_mask.repeat_interleave(num_samples, dim=0)
        resp_mask = response_mask(responses, self.eos)
        full = torch.cat([tokens, responses], dim=1)
        full_mask = torch.cat([mask, torch.ones_like(responses)], dim=1)
        if self.settings.engine_logprobs:
            logprobs = engine_lp * resp_mask
        else:
            device = next(self.logprob_model.parameters()).device
            logprobs = (
                sequence_logprobs(
                    self.logprob_model, full.to(device), full_mask.to(device), tokens.shape[1], params.temperature
                )
                .float()
                .cpu()
            )
        return GenerationOutput(
            tokens=full, attention_mask=full_mask, response_mask=resp_mask, logprobs=logprobs, version=version
        )
