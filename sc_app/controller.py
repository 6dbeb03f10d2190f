"""SingleControllerActor: one Ray actor, one asyncio loop — rollout pump, sampler, train pump, save.

``__init__`` does no construction: everything arrives built in one ``SingleControllerActorArgs`` (seed flow 2);
the data-plane client is connect-only and only ``run()`` builds it (a live client cannot be pickled), after the
driver sealed the restore decision — the shared guard refuses it otherwise.

Invariants:
* commits and drops go through ``barrier.mutation()`` (inside ``TQReplayBuffer``); the advantage stage
  (read rows back, write advantages onto the same rows) takes no barrier slot — it runs in the train pump,
  the same task as the save, so it can never overlap a snapshot;
* save order (seed): tmp → policy → loader → [window: index → list_sample_ids == index → data-plane snapshot]
  → sidecar → manifest → fsync → rename; nothing is resumable until the rename;
* the index is loaded and checked against ``list_sample_ids()`` before any pump starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch
from tensordict import TensorDict

from sc_app import __version__
from sc_app.barrier import DataPlaneCheckpointBarrier
from sc_app.checkpoint import BundleWriter, hmac_key_from_env, prune, torch_io
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.lease import Lease, LeaseLost
from sc_app.checkpoint.verify import read_sidecar
from sc_app.config import AppConfig
from sc_app.faults import fault_point
from sc_app.policy.grpo import group_advantages
from sc_app.policy.loader import PromptLoader
from sc_app.replay_buffer import Group, TQReplayBuffer

log = logging.getLogger(__name__)


class InventoryMismatch(RuntimeError):
    """Rows stored in the data plane differ from the replay index; no bundle is cut from such a state."""


class SaveFailed(RuntimeError):
    """A save failed and ``checkpoint.on_save_error=stop``; older bundles are intact."""


class _StopNow(Exception):
    """The driver asked to stop while the train pump was waiting for rollouts."""


@dataclass
class SingleControllerActorArgs:
    """Everything the controller needs, built on the driver, pickled once."""

    cfg_json: str
    run_id: str
    trainers: list[Any]
    generators: list[Any]
    start_step: int = 0
    start_version: int = 0
    loader_state: dict[str, Any] | None = None
    sidecar_path: str | None = None
    data_plane_checkpoint_metadata: dict[str, Any] | None = None  # what the driver restored (flow 1 → 2)
    resumed_from: str | None = None
    lease: Lease | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def group_id_for(prompt_index: int) -> str:
    return f"p{prompt_index}"


def _versions() -> dict[str, str]:
    import transfer_queue

    return {
        "sc_app": __version__,
        "ray": ray.__version__,
        "torch": torch.__version__,
        "transferqueue": getattr(transfer_queue, "__version__", "0.1.11"),
    }


@ray.remote
class SingleControllerActor:
    def __init__(self, args: SingleControllerActorArgs) -> None:
        self.args = args
        self.cfg = AppConfig.model_validate_json(args.cfg_json)
        self._progress: list[dict[str, Any]] = []
        self._stop_requested = False

    # ------------------------------------------------------------------ control surface for the driver
    def progress(self, since: int) -> list[dict[str, Any]]:
        return self._progress[since:]

    async def request_stop(self) -> None:
        self._stop_requested = True
        cond = getattr(self, "_cond", None)
        if cond is not None:
            async with cond:
                cond.notify_all()

    # ------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        cfg = self.cfg
        self.client = TransferQueueDataPlane(
            bootstrap=False, namespace=cfg.ray.namespace, snapshot=cfg.data_plane.snapshot
        )
        self.barrier = DataPlaneCheckpointBarrier()
        self.buffer = TQReplayBuffer(
            self.client,
            self.barrier,
            partition=cfg.data_plane.partition,
            group_size=cfg.grpo.num_generations_per_prompt,
        )
        restored_rows = 0
        if self.args.sidecar_path is not None:
            meta = self.args.data_plane_checkpoint_metadata or {}
            self.buffer.load_state_dict(
                read_sidecar(Path(self.args.sidecar_path)), expected_digest=meta.get("digest", "")
            )
            restored_rows = self.buffer.rows
        stored = await self.client.list_sample_ids(cfg.data_plane.partition)
        if stored != self.buffer.sample_ids():
            raise InventoryMismatch(
                f"data plane holds {len(stored)} rows but the replay index lists {self.buffer.rows}; refusing to start"
            )
        self.loader = PromptLoader()
        if self.args.loader_state is not None:
            self.loader.load_state_dict(self.args.loader_state, skip=self.buffer.prompt_indices())
        self.version = self.args.start_version
        self.step = self.args.start_step
        self._cond = asyncio.Condition()
        self._inflight = 0
        self._rollout_error: BaseException | None = None
        self._stopping = False
        self._trace_fh = open(cfg.run.trace_file, "a") if cfg.run.trace_file else None  # noqa: SIM115
        self._trace(ev="start", step=self.step, restored_rows=restored_rows, run_id=self.args.run_id)
        pumps = [asyncio.create_task(self._rollout_pump(i, w)) for i, w in enumerate(self.args.generators)]
        try:
            return await self._train_pump()
        finally:
            self._stopping = True
            async with self._cond:
                self._cond.notify_all()
            for t in pumps:
                t.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            if self._trace_fh:
                self._trace_fh.close()

    def _trace(self, **event: Any) -> None:
        if self._trace_fh:
            self._trace_fh.write(json.dumps({"t": time.time(), **event}) + "\n")
            self._trace_fh.flush()

    # ------------------------------------------------------------------ rollout pump (flow 3)
    def _capacity_left(self, batch: int) -> bool:
        return len(self.buffer) + self._inflight + batch <= self.cfg.grpo.max_groups_buffered

    async def _rollout_pump(self, worker_index: int, worker: Any) -> None:
        g = self.cfg.grpo
        batch = max(1, g.prompts_per_step // 2)
        try:
            while not self._stopping:
                async with self._cond:
                    await self._cond.wait_for(lambda: self._stopping or self._capacity_left(batch))
                    if self._stopping:
                        return
                    idxs = [self.loader.take() for _ in range(batch)]
                    self._inflight += batch
                self._trace(ev="issue", prompts=idxs, worker=worker_index)
                try:
                    out = await worker.generate.remote(idxs)
                    for j, idx in enumerate(idxs):
                        rows = slice(j * g.num_generations_per_prompt, (j + 1) * g.num_generations_per_prompt)
                        fields = TensorDict(
                            {
                                "tokens": out["tokens"][rows],
                                "logprobs": out["logprobs"][rows],
                                "reward": out["rewards"][rows],
                            },
                            batch_size=g.num_generations_per_prompt,
                        )
                        await self.buffer.commit(group_id_for(idx), idx, int(out["version"]), fields)
                        self.loader.settled(idx)
                        async with self._cond:
                            self._inflight -= 1
                            self._cond.notify_all()
                except BaseException:
                    async with self._cond:
                        self._inflight = max(0, self._inflight - sum(1 for i in idxs if i in self.loader.pending))
                    raise
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.exception("rollout pump %d failed", worker_index)
            self._rollout_error = exc
            async with self._cond:
                self._cond.notify_all()

    async def _drop(self, groups: list[Group]) -> None:
        """Clear groups through the barrier, then wake the rollout pumps waiting for buffer space."""
        await self.buffer.drop([grp.group_id for grp in groups])
        async with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------------ sampler
    async def _sample(self, n: int) -> list[Group]:
        max_stale = self.cfg.grpo.max_staleness
        while True:
            stale = [grp for grp in self.buffer.groups() if self.version - grp.version > max_stale]
            if stale:
                await self._drop(stale)
                self._trace(ev="drop_stale", prompts=[grp.prompt_index for grp in stale])
            fresh = self.buffer.groups()
            if len(fresh) >= n:
                return fresh[:n]
            if self._rollout_error is not None:
                raise RuntimeError("rollout pump failed") from self._rollout_error
            if self._stop_requested:
                raise _StopNow
            async with self._cond:
                await self._cond.wait_for(
                    lambda: (
                        len(self.buffer) >= n
                        or self._rollout_error is not None
                        or self._stopping
                        or self._stop_requested
                    )
                )

    # ------------------------------------------------------------------ train pump
    async def _train_pump(self) -> dict[str, Any]:
        cfg = self.cfg
        partition = cfg.data_plane.partition
        rewards: list[float] = []
        last_saved = self.step
        while self.step < cfg.run.max_steps and not self._stop_requested:
            started = time.perf_counter()
            try:
                groups = await self._sample(cfg.grpo.prompts_per_step)
            except _StopNow:
                break
            ids = [sid for grp in groups for sid in grp.sample_ids]
            staleness = sum(self.version - grp.version for grp in groups) / len(groups)
            # advantage stage (flow 4): read rows back, overwrite one field on the same rows; no barrier slot
            td = await self.client.get_samples(partition, ids, ["reward"])
            adv = group_advantages(td["reward"], cfg.grpo.num_generations_per_prompt)
            await self.client.put_samples(partition, ids, TensorDict({"advantage": adv}, batch_size=len(ids)))
            next_version = self.version + 1
            results = await asyncio.gather(*[t.train_step.remote(ids, next_version) for t in self.args.trainers])
            self.version = next_version
            self.step += 1
            await self._drop(groups)
            weights = self.args.trainers[0].get_weights.remote()
            await asyncio.gather(*[w.set_weights.remote(weights, self.version) for w in self.args.generators])
            mean_reward = float(td["reward"].mean())
            rewards.append(mean_reward)
            self._trace(ev="train", step=self.step, prompts=[grp.prompt_index for grp in groups])
            record: dict[str, Any] = {
                "step": self.step,
                "reward": mean_reward,
                "loss": sum(r["loss"] for r in results) / len(results),
                "staleness": staleness,
                "rows_held": self.buffer.rows,
                "step_seconds": time.perf_counter() - started,
            }
            if cfg.checkpoint.enabled and (
                self.step % cfg.checkpoint.save_period == 0 or self.step == cfg.run.max_steps
            ):
                outcome = await self._save_or_report()
                record["saved" if "bundle" in outcome else "save_error"] = outcome
                last_saved = self.step if "bundle" in outcome else last_saved
            self._progress.append(record)
        if self._stop_requested and cfg.checkpoint.enabled and last_saved != self.step:
            outcome = await self._save_or_report()
            key = "saved" if "bundle" in outcome else "save_error"
            self._progress.append({"step": self.step, "stop": True, key: outcome})
        return {
            "final_step": self.step,
            "version": self.version,
            "first_rewards": rewards[:5],
            "last_rewards": rewards[-5:],
            "stopped_early": self._stop_requested and self.step < cfg.run.max_steps,
        }

    # ------------------------------------------------------------------ save (flows 5 and 6)
    async def _save_or_report(self) -> dict[str, Any]:
        """Save; a failed save (full disk, I/O error) is reported per ``checkpoint.on_save_error``.

        ``LeaseLost`` always propagates: a superseded run must stop, not keep training.
        """
        try:
            return await self._save()
        except LeaseLost:
            raise
        except OSError as exc:
            msg = (
                f"save of step {self.step} to {self.cfg.checkpoint.dir} failed: {exc.strerror or exc}; "
                "its tmp dir was removed and every older bundle is intact"
            )
            log.error(msg)
            self._trace(ev="save_failed", step=self.step, error=str(exc))
            if self.cfg.checkpoint.on_save_error == "stop":
                raise SaveFailed(msg + " (checkpoint.on_save_error=stop)") from None
            return {"error": msg}

    async def _save(self) -> dict[str, Any]:
        cfg = self.cfg
        root = Path(cfg.checkpoint.dir)
        t0 = time.perf_counter()
        lease = self.args.lease
        if lease is not None:
            await asyncio.to_thread(lease.check)
        fault_point("save.begin")
        writer = BundleWriter(root, self.step, hmac_key=hmac_key_from_env(), lease=lease)
        await asyncio.to_thread(writer.begin)
        try:
            loader_state = self.loader.state_dict()  # note the loader place
            try:
                await self.args.trainers[0].save.remote(str(writer.policy_dir))
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, OSError):  # e.g. a full disk: report it as the I/O error it is
                    raise exc.cause from None
                raise
            fault_point("save.policy")
            await asyncio.to_thread(torch_io.save, loader_state, writer.loader_path)
            fault_point("save.loader")
            async with self.barrier.checkpoint():
                w0 = time.perf_counter()
                fault_point("save.window")
                meta = self.buffer.metadata_state_dict()
                stored = await self.client.list_sample_ids(cfg.data_plane.partition)
                if stored != self.buffer.sample_ids():
                    raise InventoryMismatch(
                        f"step {self.step}: data plane holds {len(stored)} rows, index lists {self.buffer.rows}"
                    )
                captured = {  # everything the bundle records about itself, captured once, in the window
                    "step": self.step,
                    "epoch": lease.epoch if lease is not None else 0,
                    "trainer_version": self.version,
                    "loader": {"next_index": loader_state["next_index"], "reissue": len(loader_state["reissue"])},
                    "digest": meta["digest"],
                    "groups": len(meta["groups"]),
                }
                snapshot = await self.client.save_checkpoint(
                    writer.data_plane_dir,
                    {**captured, "mode": "authoritative", "run_id": self.args.run_id},
                    cfg.data_plane.partition,
                    sorted(stored),
                )
                window = time.perf_counter() - w0
                self.buffer.freeze(stored)  # captured rows may not change until the snapshot is written
            try:
                data_plane = await snapshot.write()
            finally:
                self.buffer.thaw()
            fault_point("save.snapshot")
            await asyncio.to_thread(torch_io.save, meta, writer.sidecar_path)
            fault_point("save.sidecar")
            fields = {
                "run_id": self.args.run_id,
                "epoch": captured["epoch"],
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "trainer_version": captured["trainer_version"],
                "loader": captured["loader"],
                "replay": {
                    "digest": captured["digest"],
                    "groups": captured["groups"],
                    "rows": captured["groups"] * cfg.grpo.num_generations_per_prompt,
                    "partition": cfg.data_plane.partition,
                    "group_size": cfg.grpo.num_generations_per_prompt,
                },
                "compat": compat_of(cfg),
                "versions": _versions(),
            }
            final = await asyncio.to_thread(writer.commit, fields)
        except BaseException:
            await asyncio.to_thread(writer.abort)
            raise
        fault_point("save.done")
        removed = await asyncio.to_thread(prune, root, cfg.checkpoint.keep, newest_verified=final)
        self._trace(ev="save", step=self.step, digest=captured["digest"], groups=captured["groups"])
        return {
            "bundle": final.name,
            "seconds": time.perf_counter() - t0,
            "window_seconds": window,
            "groups": captured["groups"],
            "data_plane_bytes": data_plane["bytes"],
            "pruned": removed,
        }
