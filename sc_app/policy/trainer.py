"""Trainer workers: Ray actors holding the model and optimizer; several of them train data-parallel.

With more than one worker they form a ``torch.distributed`` group (gloo on CPU, NCCL when every worker has a
GPU) and average gradients, so all ranks hold identical weights; rank 0 saves and serves weights.
Each worker reads its shard of the step's rows straight from TransferQueue (connect-only client).
"""

from __future__ import annotations

import copy
import logging
import os
import socket
from pathlib import Path
from typing import Any

import ray
import torch

from sc_app import torch_io
from sc_app.background import lower_current_thread_priority
from sc_app.checkpoint.layout import MODEL_FILE, OPTIMIZER_FILE
from sc_app.config import AppConfig
from sc_app.policy.grpo import clipped_pg_loss
from sc_app.policy.model import TinyCausalLM, response_logprobs

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


# Every method runs on the actor's one default thread, in call order, except ``write_captured``: it has its own
# thread ("io"), so a checkpoint's policy files are written while the next steps train.
@ray.remote(concurrency_groups={"io": 1})
class TrainerWorker:
    def __init__(self, cfg_json: str, rank: int, world_size: int) -> None:
        torch.set_num_threads(1)
        self.cfg = AppConfig.model_validate_json(cfg_json)
        self.rank = rank
        self.world_size = world_size
        torch.manual_seed(self.cfg.run.seed)
        self.model = TinyCausalLM(self.cfg.model)
        self.device = torch.device("cuda" if torch.cuda.is_available() and self.cfg.trainer.num_gpus > 0 else "cpu")
        self.model.to(self.device)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.cfg.grpo.learning_rate)
        self.version = 0
        self._dp: Any = None
        self._captured: tuple[dict[str, Any], dict[str, Any]] | None = None

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), _free_port()

    def init_process_group(self, master_addr: str, master_port: int) -> str:
        """Join the data-parallel group; returns the backend used."""
        if self.world_size == 1:
            return "none"
        import torch.distributed as dist

        backend = "nccl" if self.device.type == "cuda" else "gloo"
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size)
        for p in self.model.parameters():  # identical start on every rank
            dist.broadcast(p.data, src=0)
        return backend

    def _client(self) -> Any:
        if self._dp is None:
            from sc_app.data_plane.transferqueue import TransferQueueDataPlane

            self._dp = TransferQueueDataPlane(bootstrap=False, namespace=self.cfg.ray.namespace)
        return self._dp

    def train_step(self, sample_ids: list[str], version: int, capture: bool = False) -> dict[str, float]:
        """One optimizer step on this rank's shard of ``sample_ids`` (rows carry advantages already).

        ``capture``: also ``capture_state()`` right after the step (the step a checkpoint will be cut at), which
        saves the checkpoint a separate call while training is paused."""
        shard = sample_ids[self.rank :: self.world_size]
        td = self._client().get_samples_sync(self.cfg.data_plane.partition, shard, ["tokens", "logprobs", "advantage"])
        tokens = td["tokens"].to(self.device)
        old_logp = td["logprobs"].to(self.device)
        adv = td["advantage"].to(self.device)
        self.model.train()
        new_logp = response_logprobs(self.model, tokens, self.cfg.task.prompt_len)
        loss = clipped_pg_loss(new_logp, old_logp, adv)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.world_size > 1:
            import torch.distributed as dist

            for p in self.model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= self.world_size
        self.optimizer.step()
        self.version = version
        if capture:
            self.capture_state()
        return {"loss": float(loss.detach()), "rows": float(len(shard))}

    def get_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def capture_state(self) -> int:
        """Copy weights + optimizer (rank 0) for ``write_captured``; returns the captured version.

        Runs on the training thread, between steps, so the copy is one consistent step; training may go on
        as soon as it returns."""
        if self.rank == 0:
            weights = self.get_weights()
            if self.device.type == "cpu":  # get_weights() already copied to the host for a GPU model
                weights = {k: v.clone() for k, v in weights.items()}
            self._captured = (
                {"model": weights, "version": self.version},
                copy.deepcopy(self.optimizer.state_dict()),
            )
        return self.version

    @ray.method(concurrency_group="io")
    def write_captured(self, policy_dir: str) -> list[str]:
        """Write the last capture into ``policy_dir`` (which must exist), fsynced; returns the files written.

        Runs on the actor's io thread, so a write never holds up ``train_step``."""
        if self.rank != 0:
            return []
        lower_current_thread_priority()  # this thread only: the training thread keeps the CPU first
        if self._captured is None:
            raise RuntimeError("write_captured() before capture_state()")
        model, optimizer = self._captured
        out = Path(policy_dir)
        torch_io.save(model, out / MODEL_FILE)
        torch_io.save(optimizer, out / OPTIMIZER_FILE)
        return [MODEL_FILE, OPTIMIZER_FILE]

    def load(self, policy_dir: str) -> int:
        """Restore weights + optimizer from a *verified* bundle (``weights_only=True``); returns the version."""
        d = Path(policy_dir)
        state = torch_io.load(d / MODEL_FILE, map_location=self.device)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(torch_io.load(d / OPTIMIZER_FILE, map_location=self.device))
        self.version = int(state["version"])
        return self.version
