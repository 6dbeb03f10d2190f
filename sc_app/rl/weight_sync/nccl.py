"""``generation.weight_sync: nccl`` (GPU, ``generation.engine=vllm`` only): each weights version goes from trainer rank
0's GPU to every vLLM engine worker's GPU by NCCL broadcast, not through Ray's object store. **Untested here (no GPU
where this was built);** ``ops/gpu-smoke.sh`` with ``GPU_SMOKE_WEIGHT_SYNC=nccl`` runs it on a GPU machine.

The control path stays the object-store one (``push``), with a small object in place of the state dict: trainer
rank 0's sender (``NcclSender``) returns an ``NcclWeightsOffer`` (names, dtypes, shapes, where the group meets) and
broadcasts the tensors on a thread of its own; every generation worker's engine hands the offer to its receiver
(``NcclReceiver``), whose ``RECEIVE_METHOD`` on each engine worker (``sc_app.rl.hf.vllm_weights``) receives into
fresh buffers and reloads them in place. The group — rank 0 the trainer, then each engine's workers at
``1 + worker_index * tensor_parallel_size + tp_rank`` — is formed at the first offer (vLLM's stateless NCCL group:
no torch.distributed default group on either side). The trainer's next step waits for the broadcast to end
(``wait``), so a version is never sent while the optimizer changes it.

Every engine of the group takes part in every broadcast: a push that skips a dead worker, or reaches a replacement
worker alone (``push``), leaves the broadcast short of a rank. Unchanged from before the seam, and untested.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from sc_app.rl.weight_sync.base import Received, WeightReceiver, WeightSender, WeightTransport
from sc_app.rl.weight_sync.object_store import StateDictSender

RECEIVE_METHOD = "sc_app_receive_nccl"  # a method of vllm_weights.WeightLoadExtension, called by name


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

    def payload(self, weights: Mapping[str, torch.Tensor] | None) -> NcclWeightsOffer | None:
        return None if weights is None else self.offer(weights)

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


class NcclReceiver:
    """A vLLM engine's workers join the group at ``rank_offset`` (+ their tensor-parallel rank) and receive."""

    def __init__(self, rank_offset: int) -> None:
        self.rank_offset = rank_offset

    def receive(self, llm: Any, payload: Any) -> Received:
        loaded = llm.collective_rpc(RECEIVE_METHOD, args=(payload, self.rank_offset))
        return Received(int(loaded[0]))  # the bytes reached the engine's workers only


class NcclTransport(WeightTransport):
    """Trainer rank 0 sends (the other ranks' ``get_weights`` return None, as ever); each engine receives."""

    name = "nccl"

    def __init__(self, num_engines: int, tensor_parallel_size: int) -> None:
        self.num_engines, self.tensor_parallel_size = num_engines, tensor_parallel_size

    def sender(self, rank: int) -> WeightSender:
        if rank != 0:
            return StateDictSender()
        return NcclSender(group_world_size(self.num_engines, self.tensor_parallel_size))

    def receiver(self, worker_index: int) -> WeightReceiver:
        return NcclReceiver(rank_offset(worker_index, self.tensor_parallel_size))
