"""Weights into a running vLLM engine, in memory: a worker extension vLLM mixes into its worker class
(``LLM(worker_extension_cls=EXTENSION_CLS)``), whose methods the weight transports' receivers call by name through
``LLM.collective_rpc`` on every worker of the engine (every tensor-parallel rank): ``LOAD_METHOD`` with a state dict
(``sc_app.rl.weight_sync.object_store``), ``RECEIVE_METHOD`` with an offer (``sc_app.rl.weight_sync.nccl``).

Calling a method by name needs no pickled function (so not ``VLLM_ALLOW_INSECURE_SERIALIZATION``); with the
engine core in-process (``vllm_engine``) the state dict reaches the model runner by reference.

Each version lands by the **fast path** (``vllm_param_map``): the trainer's names mapped once onto the engine's own
parameters (fused q/k/v and gate/up, tied embeddings, dtype), then one ``copy_`` per tensor into them. Where the map
does not cover the model (quantized, tensor parallel, a layout it cannot explain) the worker says so once and uses
vLLM's in-place reload (``model_runner.reload_weights``: every layer's own ``weight_loader``), as it does when a
caller asks for it (``fast=False``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

EXTENSION_CLS = "sc_app.rl.hf.vllm_weights.WeightLoadExtension"

log = logging.getLogger(__name__)


class WeightLoadExtension:
    """Methods added to vLLM's worker; ``self`` is that worker (it has ``model_runner``)."""

    model_runner: Any

    def sc_app_load_weights(self, weights: Mapping[str, Any], fast: bool = True) -> int:
        """Load a full Hugging Face state dict in place; returns the number of tensors given."""
        if not (fast and self._sc_app_fast_load(weights)):
            self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
            self._sc_app_path = "reload"
        return len(weights)

    def sc_app_sync_path(self) -> str:
        """``fast`` or ``reload``: how the last version landed (for tests and the bench)."""
        return str(getattr(self, "_sc_app_path", "none"))

    def _sc_app_fast_load(self, weights: Mapping[str, Any]) -> bool:
        """The version through the param map (built at the first version, rebuilt if the trainer's names, shapes
        or dtypes change); False (said once per layout) where the map does not cover the model."""
        from sc_app.rl.hf import vllm_param_map

        key = vllm_param_map.signature(weights)
        pmap = getattr(self, "_sc_app_param_map", None)
        if getattr(self, "_sc_app_unmapped", None) == key:
            return False
        if pmap is None or pmap.key != key:
            model = self.model_runner.get_model()
            try:
                pmap = vllm_param_map.build(model, self.model_runner.vllm_config, weights)
            except vllm_param_map.Unmapped as exc:
                log.warning(
                    "weight sync: %s is not covered by the fast map (%s); every version uses vLLM's reload_weights",
                    type(model).__name__,
                    exc,
                )
                self._sc_app_unmapped, self._sc_app_param_map = key, None
                return False
            self._sc_app_param_map = pmap
        pmap.load(weights)
        self._sc_app_path = "fast"
        return True

    def sc_app_receive_nccl(self, offer: Any, rank_offset: int) -> int:
        """``generation.weight_sync=nccl``: receive the version ``offer`` announces from trainer rank 0 (joining the
        group the first time) and load it in place (the same fast path); returns the number of tensors."""
        from sc_app.rl.weight_sync.nccl import receive

        comm, received = receive(
            offer, rank_offset + int(getattr(self, "rank", 0)), getattr(self, "_sc_app_comm", None)
        )
        self._sc_app_comm = comm
        return self.sc_app_load_weights(dict(received))
