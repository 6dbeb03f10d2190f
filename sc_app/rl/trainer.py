"""Trainer workers: Ray actors around a trainer backend (``sc_app.rl.backend``); several train data-parallel.

With more than one worker they form a ``torch.distributed`` group (gloo on CPU, NCCL when every worker has a GPU)
before the backend is built (``setup``). Each worker reads its share of the step's rows straight from
TransferQueue (connect-only client). Every method runs on the actor's one default thread, in call order, except
``write_captured``: it has its own thread ("io", at a lower priority), so a checkpoint's policy files are written
while the next steps train; and ``reset`` (thread "control"), so that it reaches a rank whose step is blocked.

A warm in-job restore keeps a live worker's process: ``reset`` (the process group intact: the bundle is then read
into the existing model by ``load``) or ``rejoin`` (a rank died: the group is formed again with its replacement
and the backend rebuilt on it in this process, then ``load``). ``train_step`` is fenced (``sc_app.rl.fencing``).
A spare (``TrainerSpare``, ``trainer.spare_ranks``) is a trainer worker without a rank yet, warmed up while the job
trains; a warm in-job restore gives it a dead rank's place.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import torch

from sc_app.checkpoint import node_parts
from sc_app.checkpoint.lease import CheckpointDirNotShared, Lease, not_shared
from sc_app.checkpoint.node_parts import PolicyPart
from sc_app.checkpoint.remote.parts import PartTarget, RemoteLink, upload_part
from sc_app.checkpoint.remote.store import Store
from sc_app.config.app import AppConfig
from sc_app.faults import fault_point
from sc_app.io.background import background_executor, lower_current_thread_priority
from sc_app.rl.backend import PolicyFingerprint, TrainerBackend, TrainStepResult, WorkerReset, device_for
from sc_app.rl.factory import make_trainer_backend, prepare_policy_check
from sc_app.rl.fencing import EpochFence
from sc_app.rl.weight_sync.base import WeightSender
from sc_app.rl.weight_sync.factory import transport_for

log = logging.getLogger(__name__)

KEPT_RECORDS = 64


CONCURRENCY = {"io": 1, "control": 1}
SPARE_NICE = 19  # a spare's warm-up: the lowest priority (Ray starts its workers at nice 15)


@ray.remote(concurrency_groups=CONCURRENCY)
class TrainerWorker:
    def __init__(self, cfg_json: str, rank: int, world_size: int) -> None:
        torch.set_num_threads(1)
        self.cfg = AppConfig.model_validate_json(cfg_json)
        self.rank = rank
        self.world_size = world_size
        self.device = device_for(self.cfg.trainer.num_gpus)
        self._backend: TrainerBackend | None = None
        self._dp: Any = None
        self._sender: WeightSender | None = None  # what get_weights returns (sc_app.rl.weight_sync), from setup
        self._store: Any = None  # rank 0's rendezvous store (torch.distributed.TCPStore), from address()
        self.fence = EpochFence()
        self._kept: list[Any] = []  # the controller's newest step records (keep_progress)
        # checkpoint.volume=local: this node may have a disk of its own at checkpoint.dir (sc_app.checkpoint.node_parts)
        self._own_disk_ok = self.cfg.checkpoint.volume == "local"
        self._root = Path(self.cfg.checkpoint.dir)
        self._bucket: tuple[RemoteLink, Store] | None = None  # parts=direct: the client this rank uploads with

    def address(self) -> tuple[str, int]:
        """Rank 0: where its rendezvous store listens. The store is bound here, on a port the kernel picks, and
        kept until ``setup``: a port picked first and bound later could be taken in between on a busy node."""
        import torch.distributed as dist

        self._store = dist.TCPStore("0.0.0.0", 0, self.world_size, is_master=True, wait_for_workers=False)
        return ray.util.get_node_ip_address(), int(self._store.port)

    def sees_checkpoint_dir(self, lease: Lease) -> node_parts.DirView:
        """Whether this rank's node sees the run's checkpoint directory (``LeaseLost`` when another run took it). Not
        seeing it is ``CheckpointDirNotShared`` unless ``checkpoint.volume=local`` (then ``sees`` is False: its
        parts go through ``.node_parts/``). A call of its own, not part of ``setup``: the other ranks' setup must
        not wait in the group for a rank that failed before it."""
        node = ray.get_runtime_context().get_node_id()
        try:
            lease.check_seen_by(self._who)
        except CheckpointDirNotShared:
            if not self._own_disk_ok:
                raise
            return node_parts.DirView(False, node)
        return node_parts.DirView(True, node)

    def setup(self, master_addr: str, master_port: int) -> str:
        """Join the data-parallel group (with several workers) through rank 0's store, then build the backend;
        returns the torch.distributed backend used ("none" for one worker)."""
        used = "none"
        if self.world_size > 1:
            import torch.distributed as dist

            used = "nccl" if self.device.type == "cuda" else "gloo"
            store = self._store if self.rank == 0 else dist.TCPStore(master_addr, master_port, self.world_size)
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
            dist.init_process_group(used, store=store, rank=self.rank, world_size=self.world_size)
        self._backend = make_trainer_backend(self.cfg, self.rank, self.world_size, self.device)
        self._sender = transport_for(self.cfg).sender(self.rank)
        return used

    @property
    def backend(self) -> TrainerBackend:
        if self._backend is None:
            raise RuntimeError("TrainerWorker.setup() was not called")
        return self._backend

    @property
    def sender(self) -> WeightSender:
        if self._sender is None:
            raise RuntimeError("TrainerWorker.setup() was not called")
        return self._sender

    def _client(self) -> Any:
        if self._dp is None:
            from sc_app.data_plane.transferqueue import TransferQueueDataPlane

            self._dp = TransferQueueDataPlane(bootstrap=False, namespace=self.cfg.ray.namespace)
        return self._dp

    @ray.method(concurrency_group="control")
    def reset(self, epoch: int) -> WorkerReset:
        """A warm in-job restore keeps this rank: calls of an older epoch are refused from now on, and the data-plane
        client is dropped (the data plane is rebuilt; the next step attaches to the new one, after the restore is
        sealed). ``load`` follows. Runs on its own thread ("control"): a step of the old job blocked reading from a
        dead storage unit ends (``DataPlaneDetached``) instead of holding this rank forever."""
        self.fence.advance(epoch)
        before = self._backend.version if self._backend is not None else 0
        if self._dp is not None:
            from sc_app.data_plane.transferqueue import detach_transferqueue

            detach_transferqueue()
            self._dp = None
        return WorkerReset(os.getpid(), before, self.fence.refused)

    def rejoin(self, master_addr: str, master_port: int, epoch: int) -> WorkerReset:
        """``reset``, then the process group formed again (a rank died: its replacement joins through rank 0's new
        store) and the backend rebuilt on it in this process — the model is bound to the group it was built on."""
        out = self.reset(epoch)
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        self._backend = self._sender = None
        self.setup(master_addr, master_port)
        return out

    def train_step(
        self, sample_ids: list[str], version: int, capture: bool = False, epoch: int | None = None
    ) -> TrainStepResult:
        """One optimizer step on this rank's share of ``sample_ids`` (rows carry advantages already).

        ``capture``: also ``capture_state()`` right after the step (the step a checkpoint will be cut at), which
        saves the checkpoint a separate call while training is paused. ``epoch``: refused when older than this
        rank's (a step of the job before a warm restore never lands on the restored state)."""
        self.fence.admit(epoch, "train_step")
        self.sender.wait()  # the last version's bytes may still be leaving (nccl): the step changes them
        share = sample_ids[self.rank :: self.world_size]
        read_started = time.perf_counter()
        rows = self._client().get_samples_sync(self.cfg.data_plane.partition, share, list(self.backend.fields))
        read_seconds = time.perf_counter() - read_started
        self.fence.admit(epoch, "train_step")  # a reset while this step read: the old job's step never trains
        result = self.backend.train_step(rows, version)
        if capture:
            self.backend.capture()
        return replace(result, get_seconds=read_seconds)

    def get_weights(self) -> dict[str, torch.Tensor] | Any | None:
        """Rank 0: the whole model as the weight transport carries it (the state dict itself, or under
        ``generation.weight_sync=nccl`` an offer while the tensors are broadcast); None on the other ranks. Collective
        when the backend shards the model."""
        return self.sender.payload(self.backend.full_weights())

    def capture_state(self) -> int:
        """Copy this rank's weights + optimizer state for ``write_captured``; returns the captured version."""
        return self.backend.capture()

    @ray.method(concurrency_group="io")
    def write_captured(self, policy_dir: str, target: PartTarget | None = None) -> PolicyPart:
        """Write the last capture into ``policy_dir`` (which the controller created), fsynced; returns the files
        this rank hashed as it wrote them (the manifest hashes any other file itself). On a node with a disk of its
        own there (``checkpoint.volume=local``) the part is staged on that disk for the controller to gather, or,
        with a ``target`` (``checkpoint.remote.parts=direct``), uploaded from there to the bucket and dropped."""
        lower_current_thread_priority()  # this thread only: the training thread keeps the CPU first
        if Path(policy_dir).is_dir():
            return PolicyPart(self.backend.write_captured(Path(policy_dir)))
        if not self._own_disk_ok:  # the controller created it: this node sees another disk there
            raise not_shared(self._who, policy_dir, "the bundle's policy directory is not there")
        staged = node_parts.fresh(node_parts.part_dir(self._root, self.rank))
        files = self.backend.write_captured(staged)
        if target is None:
            return PolicyPart(files, socket.gethostname(), node_parts.list_files(staged))
        try:
            if self._bucket is None or self._bucket[0] != target.link:  # one client per attempt's hold on the bucket
                self._bucket = (target.link, target.link.store(self.cfg.checkpoint.remote))
            sent = upload_part(self._bucket[1], staged, node_parts.list_files(staged), files, target)
        finally:
            node_parts.clear(staged)
        return PolicyPart(sent, socket.gethostname(), uploaded=True)

    @ray.method(concurrency_group="io")
    def read_part(self, rel: str, offset: int) -> bytes:
        """The controller gathering this rank's staged part: ``node_parts.CHUNK`` bytes of one file from ``offset``."""
        return node_parts.read_chunk(node_parts.part_dir(self._root, self.rank), rel, offset)

    @ray.method(concurrency_group="io")
    def drop_part(self) -> None:
        """The bundle holds the staged part now (or its save failed): free this node's disk."""
        node_parts.clear(node_parts.part_dir(self._root, self.rank))

    def receive_policy(self, bundle: str, rel: str, offset: int, data: bytes, first: bool = False) -> None:
        """The driver sending ``bundle``'s ``policy/`` to this rank's node, for every rank there to ``load``
        (``first``: whatever an earlier send left on the node is removed)."""
        node_parts.receive(self._root, bundle, rel, offset, data, first)

    def check_received(self, bundle: str, expected: Mapping[str, str]) -> None:
        """``NodeCopyFailed`` unless the copy sent to this node holds exactly ``expected`` (name → its digest in the
        verified manifest); the driver asks before any rank of the node loads it."""
        node_parts.check_copy(node_parts.restore_dir(self._root) / bundle, expected)

    def drop_received(self) -> None:
        """Every rank of this node has loaded the copy (or the restore failed): free the node's disk."""
        node_parts.clear(node_parts.restore_dir(self._root))

    def load(self, policy_dir: str, expected: Mapping[str, str]) -> int:
        """Restore from a *verified* bundle; ``expected``: policy-dir-relative name → its digest in the manifest
        (the manifest's ``hash_alg``: BLAKE3, or sha256 for schema-1 bundles). Where this node sees another disk at
        the bundle's path, the copy the driver sent to the node and had checked (``check_received``) is loaded."""
        d = Path(policy_dir)
        bundle = d.parent.name
        if not d.parent.is_dir():  # the driver verified it: this node sees another disk there (not the bundle's fault)
            sent = node_parts.restore_dir(self._root) / bundle
            if not (self._own_disk_ok and sent.is_dir()):
                raise not_shared(self._who, d.parent, "the bundle is not there")
            d = sent
        fault_point(f"restore.policy.{bundle}")
        return self.backend.load(d, expected)

    @property
    def _who(self) -> str:
        return f"trainer rank {self.rank}"

    def fingerprint(self) -> PolicyFingerprint | None:
        return self.backend.fingerprint()

    def pid(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group="control")
    def alive(self) -> int:
        """The driver's probe for a hung process (``JobActors.probe``): answered on the "control" thread, so a rank
        whose step waits on another process still answers; a stopped or frozen rank does not."""
        return os.getpid()

    def keep_progress(self, record: Any) -> None:
        """The controller's step record, kept here (the last ``KEPT_RECORDS``) for the driver should the controller
        die before the driver polled it."""
        self._kept = [*self._kept[-(KEPT_RECORDS - 1) :], record]

    def kept_progress(self, after_step: int) -> list[Any]:
        """The kept step records past ``after_step`` (a dead controller's steps the driver never heard of)."""
        return [r for r in self._kept if r.step > after_step]


@ray.remote(concurrency_groups=CONCURRENCY)
class TrainerSpare(TrainerWorker.__ray_actor_class__):  # type: ignore[name-defined,misc]
    """A trainer worker without a rank (``sc_app.attempt.spares``): ``warm_up`` pays its process's first-time costs
    while the job trains; ``take_rank`` then makes it the dead rank's replacement, called as a new rank is
    (``setup``, ``reset``, ``load``). Its process title stays ``ray::TrainerSpare``."""

    def __init__(self, cfg_json: str, world_size: int) -> None:
        super().__init__(cfg_json, -1, world_size)

    def warm_up(self) -> int:
        """Build what a rank builds first in a process, and drop it: the backend's imports, its model on the meta
        device and its optimizer's structure (``prepare_policy_check``; a process's first optimizer imports
        ``torch._dynamo``), and on a GPU the CUDA context — on a thread at the lowest priority (nice 19, below
        Ray's workers: a spare slows the job it stands by for little). Returns this process's pid."""

        def build() -> None:
            prepare_policy_check(self.cfg)
            torch.zeros(1, device=self.device)

        with background_executor("warm-up", nice=SPARE_NICE) as pool:
            pool.submit(build).result()
        return os.getpid()

    def take_rank(self, rank: int) -> int:
        """Become trainer rank ``rank`` (before its ``setup``); once only. Returns this process's pid."""
        if self.rank != -1:
            raise RuntimeError(f"this spare is trainer rank {self.rank} already")
        self.rank = rank
        return os.getpid()
