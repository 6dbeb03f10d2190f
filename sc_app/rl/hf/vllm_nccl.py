"""``generation.weight_sync: nccl``: each weights version goes from trainer rank 0's GPU to every vLLM engine
worker's GPU by NCCL broadcast, not through Ray's object store. **Untested here (no GPU where this was built);**
``ops/gpu-smoke.sh`` with ``GPU_SMOKE_WEIGHT_SYNC=nccl`` runs it on a GPU machine.

The control path stays the object-store one, with a small object in place of the state dict: trainer rank 0's
``get_weights`` returns an ``NcclWeightsOffer`` (names, dtypes, shapes, where the group meets) and broadcasts the
tensors on a thread of its own; every generation worker's ``set_weights`` hands the offer to its engine, whose
workers receive into fresh buffers and reload them in place (``vllm_weights``). The group — rank 0 the trainer,
then each engine's workers at ``1 + worker_index * tensor_parallel_size + tp_rank`` — is formed at the first offer
(vLLM's stateless NCCL group: no torch.distributed default group on either side). The trainer's next step waits
for the broadcast to end (``wait``), so a version is never sent while the optimizer changes it.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class NcclWeightsOffer:
    address: str
    port: int
    world_size: int
    meta: tuple[tuple[str, str, tuple[int, ...]], ...]  # (name, torch dtype name, shape), in broadcast order


def group_world_size(num_engines: int, tensor_parallel_size: int) -> int:
    return 1 + num_engines * tensor_parallel_size


def rank_offset(worker_index: int, tensor_parallel_size: int) -> int:
    return 1 + worker_index * tensor_parallel_size


def _stateless_group(address: str, port: int, rank: int, world_size: int) -> Any:
    from vllm.distributed.weight_transfer.nccl_common import trainer_init

    # despite its name: vLLM's stateless NCCL group on the current CUDA device, joined at ``rank``
    return trainer_init({"master_address": address, "master_port": port, "world_size": world_size}, rank=rank)


def receive(offer: NcclWeightsOffer, rank: int, comm: Any | None) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    """On an engine worker: join the group if ``comm`` is None, then receive every tensor of ``offer``."""
    if comm is None:
        comm = _stateless_group(offer.address, offer.port, rank, offer.world_size)
    stream = torch.cuda.current_stream()
    received = []
    for name, dtype, shape in offer.meta:
        buf = torch.empty(shape, dtype=getattr(torch, dtype), device="cuda")
        comm.broadcast(buf, src=0, stream=stream)
        received.append((name, buf))
    stream.synchronize()
    return comm, received


class NcclSender:
    """On trainer rank 0 under ``weight_sync=nccl``."""

    def __init__(self, world_size: int) -> None:
        import ray

        self.address = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            self.port = int(s.getsockname()[1])
        self.world_size = world_size
        self._comm: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def offer(self, weights: Mapping[str, torch.Tensor]) -> NcclWeightsOffer:
        self.wait()
        tensors = [(name, t.detach().to("cuda").contiguous()) for name, t in weights.items()]
        meta = tuple((name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in tensors)
        self._thread = threading.Thread(target=self._send, args=(tensors,), name="nccl-weights", daemon=True)
        self._thread.start()
        return NcclWeightsOffer(self.address, self.port, self.world_size, meta)

    def _send(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        try:
            if self._comm is None:
                self._comm = _stateless_group(self.address, self.port, 0, self.world_size)
            stream = torch.cuda.current_stream()
            for _, t in tensors:
                self._comm.broadcast(t, src=0, stream=stream)
            stream.synchronize()
        except BaseException as exc:  # raised by the next wait(), on the actor's thread
            self._error = exc

    def wait(self) -> None:
        """Until the last version's broadcast ended; raises what it raised."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"NCCL weight broadcast failed: {error}") from error


def sender_for(cfg: Any, rank: int) -> NcclSender | None:
    """The sender trainer rank 0 holds under ``generation.weight_sync=nccl`` (None otherwise)."""
    gen = cfg.generation
    if rank != 0 or gen.engine != "vllm" or gen.weight_sync != "nccl":
        return None
    return NcclSender(group_world_size(gen.num_workers, gen.tensor_parallel_size))
