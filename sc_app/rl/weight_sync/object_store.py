"""``generation.weight_sync: object_store`` (the default; CPU or GPU): the payload is trainer rank 0's full state
dict, one object in Ray's object store that every generation worker reads. A vLLM engine loads it in place on every
engine worker (``LOAD_METHOD`` of the worker extension ``sc_app.rl.hf.vllm_weights``); the Hugging Face engine and
the tiny backend load it into their model directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sc_app.rl.weight_sync.base import Received, WeightReceiver, WeightSender, WeightTransport

LOAD_METHOD = "sc_app_load_weights"  # a method of vllm_weights.WeightLoadExtension, called by name


class StateDictSender:
    """The state dict is the payload; nothing outlives the call, so ``wait`` has nothing to wait for."""

    def payload(self, weights: Mapping[str, Any] | None) -> Any:
        return weights

    def wait(self) -> None:
        return None


class StateDictReceiver:
    """``fast=False`` skips the worker's param map and uses vLLM's ``reload_weights`` (the bench's comparison)."""

    def __init__(self, fast: bool = True) -> None:
        self.fast = fast

    def receive(self, llm: Any, payload: Any) -> Received:
        """Every tensor of the state dict into every engine worker, in place (no file)."""
        state = dict(payload)
        loaded = llm.collective_rpc(LOAD_METHOD, args=(state,), kwargs={"fast": self.fast})
        return Received(int(loaded[0]), state)


class ObjectStoreTransport(WeightTransport):
    name = "object_store"

    def sender(self, rank: int) -> WeightSender:
        return StateDictSender()

    def receiver(self, worker_index: int) -> WeightReceiver:
        return StateDictReceiver()
