"""Which weight transport a run uses: the one place that chooses. The transport follows the generation engine
(``generation.engine``, built by ``sc_app.rl.hf.engine_factory``): only a vLLM engine can take another transport than
the object store (``generation.weight_sync``; ``sc_app.config.engine`` refuses any other combination)."""

from __future__ import annotations

from typing import Any

from sc_app.rl.weight_sync.base import WeightTransport


def transport_for(cfg: Any) -> WeightTransport:
    """``cfg``: an ``AppConfig``. Called where each side is built: a trainer worker's ``setup`` (its sender) and a
    generation worker's engine (its receiver); both read the same keys, so both sides agree."""
    gen = cfg.generation
    if gen.engine == "vllm" and gen.weight_sync == "nccl":
        from sc_app.rl.weight_sync.nccl import NcclTransport

        return NcclTransport(gen.num_workers, gen.tensor_parallel_size)
    from sc_app.rl.weight_sync.object_store import ObjectStoreTransport

    return ObjectStoreTransport()
