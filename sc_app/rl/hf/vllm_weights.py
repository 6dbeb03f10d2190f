"""Weights into a running vLLM engine, in memory: a worker extension vLLM mixes into its worker class
(``LLM(worker_extension_cls=EXTENSION_CLS)``), whose methods the weight transports' receivers call by name through
``LLM.collective_rpc`` on every worker of the engine (every tensor-parallel rank): ``LOAD_METHOD`` with a state dict
(``sc_app.rl.weight_sync.object_store``), ``RECEIVE_METHOD`` with an offer (``sc_app.rl.weight_sync.nccl``).

Calling a method by name needs no pickled function (so not ``VLLM_ALLOW_INSECURE_SERIALIZATION``); with the
engine core in-process (``vllm_engine``) the state dict reaches the model runner by reference. vLLM's in-place
reload (``model_runner.reload_weights``) runs each model's own ``load_weights`` — the Hugging Face names are mapped
to vLLM's fused/sharded parameters there, tied embeddings included — so the trainer's plain state dict is the input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

EXTENSION_CLS = "sc_app.rl.hf.vllm_weights.WeightLoadExtension"


class WeightLoadExtension:
    """Methods added to vLLM's worker; ``self`` is that worker (it has ``model_runner``)."""

    model_runner: Any

    def sc_app_load_weights(self, weights: Mapping[str, Any]) -> int:
        """Load a full Hugging Face state dict in place; returns the number of tensors given."""
        self.model_runner.reload_weights(weights_iterator=iter(weights.items()))
        return len(weights)

    def sc_app_receive_nccl(self, offer: Any, rank_offset: int) -> int:
        """``generation.weight_sync=nccl``: receive the version ``offer`` announces from trainer rank 0 (joining the
        group the first time) and load it in place; returns the number of tensors."""
        from sc_app.rl.weight_sync.nccl import receive

        comm, received = receive(
            offer, rank_offset + int(getattr(self, "rank", 0)), getattr(self, "_sc_app_comm", None)
        )
        self._sc_app_comm = comm
        self.model_runner.reload_weights(weights_iterator=iter(received))
        return len(received)
