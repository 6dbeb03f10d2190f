"""Run inside the built image by ops/image-smoke.sh: vLLM imports, and sc-app's own engine start path
(sc_app.rl.hf.vllm_engine.start_llm: an in-process engine plus its one-token generate) serves a tiny random Llama
built here (head_dim 64, what vLLM's CPU attention supports; nothing downloaded). Prints one line
``vllm engine ok: vllm <version> on <cpu|cuda>, <seconds> s`` or exits non-zero with the cause."""

from __future__ import annotations

import sys
import tempfile
import time


def main() -> int:
    import torch
    import vllm

    from sc_app.rl.hf.random_model import RandomModelSpec, write_random_model
    from sc_app.rl.hf.vllm_engine import VLLMSettings, start_llm

    on_gpu = torch.cuda.is_available()
    spec = RandomModelSpec(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                           max_position_embeddings=256)  # fmt: skip
    model = write_random_model(tempfile.mkdtemp(prefix="sc-app-engine-check-"), spec)
    t0 = time.perf_counter()
    start_llm(VLLMSettings(model_path=str(model), dtype="float32", seed=0, max_model_len=128, on_gpu=on_gpu,
                           gpu_memory_utilization=0.3))  # fmt: skip
    where = "cuda" if on_gpu else "cpu"
    print(f"vllm engine ok: vllm {vllm.__version__} on {where}, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
