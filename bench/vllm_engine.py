"""The vLLM engine against Hugging Face ``generate()``, side by side in one run, on CPU (float32, random Llamas built
locally, nothing downloaded): the tiny Llama of the tests (hidden 128, 2 layers) and a ~100M-parameter one.

Run from the repo root: ``.venv/bin/python bench/vllm_engine.py [--quick] [--out DIR]``.
Per model, in a fresh process (vLLM binds threads in the process it runs in), with the same prompts, group size
and sampling settings for every engine, generate calls interleaved (hf, vllm, vllm+trainer-logprobs, hf, ...):

* tokens/s: response tokens (up to and including eos) per second of a whole engine call, as a generation worker
  makes it: ``hf`` = ``generate()`` + the log-prob forward; ``vllm`` = vLLM with its own log-probs
  (``grpo.old_logprobs=engine``); ``vllm+trainer-lp`` = vLLM + the trainer's log-prob forward (the default);
* weight sync: seconds to put one weights version into the running engine (``VLLMEngine.load_weights``): by the
  param map (the default; split into its copies and the CPU kernels' re-packing), by vLLM's in-place reload (the
  fallback), against a plain ``copy_`` of the same tensors into preallocated ones (the floor for moving the bytes);
* resume → first token: from nothing to the first generated token of a resumed generation worker's engine —
  start, load the bundle's weights version, one generate call of one token (Ray, TransferQueue and the trainer's
  restore come on top and are the same for both engines);
* second start: the same model and settings started again in a fresh process on the compile cache the first start
  published (``engine_cache``), as a resume, a retry or a replaced generation worker starts.
Writes ``<out>/vllm_engine.json`` and ``<out>/vllm_engine.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SPECS = {
    "tiny (0.2M)": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2},
    "~100M": {"hidden_size": 768, "intermediate_size": 2560, "num_hidden_layers": 12},
}
PROMPTS, GROUP, PROMPT_LEN = 8, 4, 8  # 32 sequences per generate call


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _model(work: Path, name: str) -> Path:
    from sc_app.rl.hf.random_model import RandomModelSpec, write_random_model

    heads = SPECS[name]["hidden_size"] // 64  # head_dim 64: what vLLM's CPU attention supports
    spec = RandomModelSpec(
        **SPECS[name], num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=256
    )
    return write_random_model(work / name.split()[0].strip("~"), spec)


def _prompts() -> Any:
    import torch

    from sc_app.rl.hf.tasks import PromptBatch

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, 26, (PROMPTS, PROMPT_LEN), generator=gen)
    return PromptBatch(tuple(range(PROMPTS)), tokens, torch.ones_like(tokens))


def _engines(model_dir: Path, max_len: int, cache_root: str) -> dict[str, Any]:
    """The three engines of the comparison, sharing one vLLM engine; plus the seconds its start took."""
    import torch

    from sc_app.rl.hf.chat import pad_id
    from sc_app.rl.hf.engine import HFGenerateEngine, eos_ids
    from sc_app.rl.hf.model_dir import check_model_dir, load_model, load_tokenizer
    from sc_app.rl.hf.vllm_engine import VLLMEngine, VLLMSettings, start_llm
    from sc_app.rl.weight_sync.object_store import StateDictReceiver

    md = check_model_dir(model_dir)
    tok, model = load_tokenizer(md), load_model(md, torch.float32)
    eos, pad = eos_ids(model, tok), pad_id(tok)
    settings = VLLMSettings(
        model_path=str(model_dir), dtype="float32", seed=0, max_model_len=max_len, cache_root=cache_root
    )
    t0 = time.perf_counter()
    llm = start_llm(settings)
    start_s = time.perf_counter() - t0
    if llm.sc_app_start.cache != "cold":
        raise RuntimeError(f"the first start found a compile cache: {llm.sc_app_start}")
    from dataclasses import replace

    return {
        "hf": HFGenerateEngine(load_model(md, torch.float32), eos=eos, pad=pad, device=torch.device("cpu")),
        "vllm": VLLMEngine(
            llm, replace(settings, engine_logprobs=True), receiver=StateDictReceiver(), eos=eos, pad=pad
        ),
        "vllm+trainer-lp": VLLMEngine(
            llm, settings, receiver=StateDictReceiver(), eos=eos, pad=pad, logprob_model=model
        ),
        "_start_s": start_s,
        "_state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def _throughput(engines: dict[str, Any], reps: int, new_tokens: int) -> dict[str, Any]:
    from sc_app.rl.hf.engine import SamplingParams

    batch, params = _prompts(), SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    rates: dict[str, list[float]] = {k: [] for k in ("hf", "vllm", "vllm+trainer-lp")}
    for _ in range(reps + 1):  # the first round warms up and is dropped
        for name in rates:
            t0 = time.perf_counter()
            out = engines[name].generate(batch, GROUP, params)
            rates[name].append(int(out.response_mask.sum()) / (time.perf_counter() - t0))
    return {name: summary(xs[1:]) for name, xs in rates.items()}


def _weight_sync(engines: dict[str, Any], reps: int) -> dict[str, Any]:
    """Per version, interleaved: the fast sync (the param map), vLLM's reload (the fallback), a plain copy."""
    import torch

    from sc_app.rl.weight_sync.object_store import StateDictReceiver

    state, engine = engines["_state"], engines["vllm"]
    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    dst = {k: torch.empty_like(v) for k, v in state.items()}
    times: dict[str, list[float]] = {"sync_s": [], "reload_s": [], "copy_s": [], "map_copy_s": [], "repack_s": []}
    paths = set()
    for version in range(1, reps + 2):
        for name, receiver in (("sync_s", StateDictReceiver()), ("reload_s", StateDictReceiver(fast=False))):
            engine.receiver = receiver
            t0 = time.perf_counter()
            engine.load_weights(state, version)
            times[name].append(time.perf_counter() - t0)
            paths.add(engine.llm.collective_rpc("sc_app_sync_path")[0])
            if name == "sync_s":
                phases = worker._sc_app_param_map.last_seconds
                times["map_copy_s"].append(phases["copy"])
                times["repack_s"].append(phases["repack"] + phases["process"])
        t0 = time.perf_counter()
        for k, v in state.items():
            dst[k].copy_(v)
        times["copy_s"].append(time.perf_counter() - t0)
    engine.receiver = StateDictReceiver()
    if paths != {"fast", "reload"}:
        raise RuntimeError(f"the fast sync or the fallback did not run: {paths}")
    mib = sum(v.numel() * v.element_size() for v in state.values()) / 2**20
    return {"MiB": mib, **{k: summary(v[1:]) for k, v in times.items()}}


def _first_token(engines: dict[str, Any], model_dir: Path) -> dict[str, float]:
    """hf: load the model, the bundle's weights, one token; vllm: (start measured above) + weights + one token."""
    import torch

    from sc_app.rl.hf.engine import HFGenerateEngine, SamplingParams
    from sc_app.rl.hf.model_dir import check_model_dir, load_model

    batch, one = _prompts(), SamplingParams(max_new_tokens=1)
    t0 = time.perf_counter()
    model = load_model(check_model_dir(model_dir), torch.float32)
    hf = HFGenerateEngine(model, eos=[2], pad=0, device=torch.device("cpu"))
    hf.load_weights(engines["_state"], 1)
    hf.generate(batch, GROUP, one)
    hf_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    engines["vllm"].load_weights(engines["_state"], 1)
    engines["vllm"].generate(batch, GROUP, one)
    return {"hf": hf_s, "vllm": engines["_start_s"] + time.perf_counter() - t0, "vllm_start": engines["_start_s"]}


def measure(name: str, work: str, reps: int, new_tokens: int) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    torch.set_num_threads(1)  # what a generation worker runs with; vLLM pins its own
    model_dir = _model(Path(work), name)
    from safetensors.torch import load_file

    params = sum(v.numel() for v in load_file(model_dir / "model.safetensors").values())
    engines = _engines(model_dir, PROMPT_LEN + new_tokens, str(_cache_root(work, name)))
    return {
        "model": name,
        "params": params,
        "tokens_per_s": _throughput(engines, reps, new_tokens),
        "weight_sync": _weight_sync(engines, reps),
        "resume_to_first_token_s": _first_token(engines, model_dir),
    }


def _cache_root(work: str, name: str) -> Path:
    return Path(work) / f"ckpt-{name.split()[0].strip('~')}" / "engine_cache"


def second_start(name: str, work: str, new_tokens: int) -> dict[str, Any]:
    """In a fresh process after ``measure``: the same model and settings start again on the cache the first start
    published (what a resume, a retry or a replaced generation worker does)."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import torch

    torch.set_num_threads(1)
    from sc_app.rl.hf.vllm_engine import VLLMSettings, start_llm

    model_dir = Path(work) / name.split()[0].strip("~")
    settings = VLLMSettings(
        model_path=str(model_dir),
        dtype="float32",
        seed=0,
        max_model_len=PROMPT_LEN + new_tokens,
        cache_root=str(_cache_root(work, name)),
    )
    t0 = time.perf_counter()
    llm = start_llm(settings)
    return {"seconds": time.perf_counter() - t0, "cache": llm.sc_app_start.cache}


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| model | params | hf tok/s | vllm tok/s | vllm+trainer-lp tok/s | weights MiB | sync s/version "
        "(copy + CPU re-pack) | reload s (fallback) | plain copy s | resume→1st token hf s | vllm s (start) "
        "| 2nd start s (cache) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def rate(s: dict[str, float]) -> str:
        return f"{s['median']:.0f} ({s['min']:.0f}-{s['max']:.0f})"

    for r in results:
        t, w, f = r["tokens_per_s"], r["weight_sync"], r["resume_to_first_token_s"]
        rows.append(
            f"| {r['model']} | {r['params'] / 1e6:.1f}M | {rate(t['hf'])} | {rate(t['vllm'])} | "
            f"{rate(t['vllm+trainer-lp'])} | {w['MiB']:.1f} | {w['sync_s']['median']:.4f} "
            f"({w['map_copy_s']['median']:.4f} + {w['repack_s']['median']:.4f}) | {w['reload_s']['median']:.4f} | "
            f"{w['copy_s']['median']:.4f} | {f['hf']:.2f} | {f['vllm']:.2f} ({f['vllm_start']:.2f}) | "
            f"{r['second_start']['seconds']:.2f} ({r['second_start']['cache']}) |"
        )
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the tiny model only, 2 repetitions (full: 3)")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    a = p.parse_args()
    names = list(SPECS)[:1] if a.quick else list(SPECS)
    reps, new_tokens = (2, 16) if a.quick else (3, 16)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="vllm-bench-") as work:
        for name in names:  # a fresh process per model: an engine binds threads and joins a process group
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                results.append(pool.submit(measure, name, work, reps, new_tokens).result())
            with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
                results[-1]["second_start"] = pool.submit(second_start, name, work, new_tokens).result()
            doc = {"host": platform.node(), "cpus": os.cpu_count(), "load": os.getloadavg(), "prompts": PROMPTS,
                   "group": GROUP, "new_tokens": new_tokens, "results": results}  # fmt: skip
            (out / "vllm_engine.json").write_text(json.dumps(doc, indent=2))  # after each model: a slow one
            (out / "vllm_engine.md").write_text(table(results))  # does not take the others' figures with it
    print(table(results))


if __name__ == "__main__":
    main()
