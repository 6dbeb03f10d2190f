"""SingleControllerActor: one Ray actor, one asyncio loop — rollout pump, sampler, train pump, save.

``__init__`` does no construction: everything arrives built in one ``SingleControllerActorArgs`` (seed flow 2);
the data-plane client is connect-only and only ``run()`` builds it (a live client cannot be pickled), after the
driver sealed the restore decision — the shared guard refuses it otherwise.

Invariants:
* commits and drops go through ``barrier.mutation()`` (inside ``TQReplayBuffer``); the advantage stage
  (read rows back, write advantages onto the same rows) takes no barrier slot and never changes which rows
  exist; while a snapshot still reads captured rows it may add a field to them but not rewrite one
  (``TQReplayBuffer.write_fields``);
* save order (seed): policy → loader → [window: index → list_sample_ids == index → data-plane capture] →
  data-plane bytes → sidecar → manifest → fsync → rename; nothing is resumable until the rename. What fixes the
  bundle's content is captured in exactly that order while training is paused (the trainer copies weights +
  optimizer, the loader place is noted, the window captures the rows and freezes them); ``tmp_step_N/`` (with
  the lease check) and every file are written from those copies after the window, behind training;
* at most one save is in flight: the next save, the end of the run and a stop request each await it first, and
  its ``thaw()`` has cleared the rows dropped meanwhile before any later window;
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
from sc_app.background import background_executor, run_blocking
from sc_app.barrier import DataPlaneCheckpointBarrier
from sc_app.checkpoint import BundleWriter, hmac_key_from_env, layout, prune, torch_io
from sc_app.checkpoint.compat import compat_of
from sc_app.checkpoint.lease import Lease, LeaseLost
from sc_app.checkpoint.verify import read_sidecar
from sc_app.config import AppConfig
from sc_app.data_plane.client import CapturedRows
from sc_app.faults import afault_point
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
        self._pending_save: tuple[int, asyncio.Task[dict[str, Any]]] | None = None
        self._save_io = background_executor("save-io")
        self._captured_version = -1  # the trainer version whose state the trainer holds a copy of
        self._last_saved = self.step
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
            if self._pending_save is not None:  # the train pump failed: let the save in flight end on its own
                # (cancelling it could race its commit thread; an unfinished bundle is never renamed anyway)
                (outcome,) = await asyncio.gather(self._pending_save[1], return_exceptions=True)
                if isinstance(outcome, BaseException):
                    log.warning("save of step %d failed while the run was failing: %r", self._pending_save[0], outcome)
            self._save_io.shutdown(wait=False)
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
            await self.buffer.write_fields(
                [grp.group_id for grp in groups], TensorDict({"advantage": adv}, batch_size=len(ids))
            )
            next_version = self.version + 1
            # the step a bundle will be cut at: the trainer copies its state right after it (no extra call then)
            capture = cfg.checkpoint.enabled and self._save_due(self.step + 1)
            results = await asyncio.gather(
                *[t.train_step.remote(ids, next_version, capture) for t in self.args.trainers]
            )
            if capture:
                self._captured_version = next_version
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
            self._progress.append(record)
            if cfg.checkpoint.enabled and self._save_due(self.step):
                await self._start_save()
            await self._collect_save(wait=False)
        await self._collect_save(wait=True)
        if self._stop_requested and cfg.checkpoint.enabled and self._last_saved != self.step:
            self._progress.append({"step": self.step, "stop": True})
            await self._start_save()
            await self._collect_save(wait=True)
        return {
            "final_step": self.step,
            "version": self.version,
            "first_rewards": rewards[:5],
            "last_rewards": rewards[-5:],
            "stopped_early": self._stop_requested and self.step < cfg.run.max_steps,
        }

    # ------------------------------------------------------------------ save (flows 5 and 6)
    def _save_due(self, step: int) -> bool:
        return step % self.cfg.checkpoint.save_period == 0 or step == self.cfg.run.max_steps

    async def _start_save(self) -> None:
        """Cut a bundle of the current step; returns once its window closed (or the save already ended).

        Pre: called from the train pump only. Post: the previous save has finished and been reported; the new
        one's policy, loader place and captured rows are fixed, the rest runs in ``self._pending_save``."""
        await self._collect_save(wait=True)
        released = asyncio.Event()
        task = asyncio.create_task(self._save_or_report(self.step, released))
        self._pending_save = (self.step, task)
        waiter = asyncio.ensure_future(released.wait())
        try:
            await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    async def _collect_save(self, *, wait: bool) -> None:
        """Report the save in flight once it is done (``wait``: await it first). Re-raises what must stop the
        run (``LeaseLost``, ``SaveFailed``, a bug); a reported I/O failure lets training continue."""
        if self._pending_save is None:
            return
        step, task = self._pending_save
        if not wait and not task.done():
            return
        self._pending_save = None
        outcome = await task
        ok = "bundle" in outcome
        self._progress.append({"step": step, "saved" if ok else "save_error": outcome})
        if ok:
            self._last_saved = step

    async def _in_background(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run blocking save I/O on the low-priority save thread (training threads get the CPU first)."""
        return await run_blocking(self._save_io, fn, *args, **kwargs)

    async def _save_or_report(self, step: int, released: asyncio.Event) -> dict[str, Any]:
        """Save; a failed save (full disk, I/O error) is reported per ``checkpoint.on_save_error``.

        ``LeaseLost`` always propagates: a superseded run must stop, not keep training.
        """
        try:
            return await self._save(released)
        except LeaseLost:
            raise
        except OSError as exc:
            msg = (
                f"save of step {step} to {self.cfg.checkpoint.dir} failed: {exc.strerror or exc}; "
                "its tmp dir was removed and every older bundle is intact"
            )
            log.error(msg)
            self._trace(ev="save_failed", step=step, error=str(exc))
            if self.cfg.checkpoint.on_save_error == "stop":
                raise SaveFailed(msg + " (checkpoint.on_save_error=stop)") from None
            return {"error": msg}

    async def _save(self, released: asyncio.Event) -> dict[str, Any]:
        """Seed order. Until ``released`` is set training is paused, and only what fixes the bundle's content
        happens: the trainer copies weights + optimizer, the loader place is noted, and the window captures and
        checks the index and freezes the captured rows. Everything that touches the disk comes after, behind
        training: tmp dir (lease check) → policy + loader files → data-plane bytes → thaw → sidecar → manifest
        → fsync → rename → prune."""
        cfg = self.cfg
        root = Path(cfg.checkpoint.dir)
        t0 = time.perf_counter()
        step = self.step  # the train pump moves on once ``released`` is set
        lease = self.args.lease
        trainer = self.args.trainers[0]
        writer = BundleWriter(root, step, hmac_key=hmac_key_from_env(), lease=lease)
        # ---- training paused: capture (the trainer already copied its state if this step was due for a save)
        captured_version = self._captured_version
        if captured_version != self.version:  # e.g. a stop request: copy now
            captured_version = await trainer.capture_state.remote()
        if captured_version != self.version:
            raise RuntimeError(f"trainer captured version {captured_version}, the controller is at {self.version}")
        loader_state = self.loader.state_dict()  # note the loader place (a fresh dict: plain ints and lists)
        async with self.barrier.checkpoint():
            w0 = time.perf_counter()
            await afault_point("save.window")
            meta = self.buffer.metadata_state_dict()
            listed = await self.client.list_samples(cfg.data_plane.partition)
            stored = set(listed)
            if stored != self.buffer.sample_ids():
                raise InventoryMismatch(
                    f"step {step}: data plane holds {len(stored)} rows, index lists {self.buffer.rows}"
                )
            captured = {  # everything the bundle records about itself, captured once, in the window
                "step": step,
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
                CapturedRows(sorted(stored), fields=self.buffer.fields_by_group(), tags=listed),
            )
            window = time.perf_counter() - w0
            self.buffer.freeze(stored)  # captured rows may not change until the snapshot is written
        blocked = time.perf_counter() - t0
        released.set()  # the train pump goes on; drops of captured groups wait for thaw()
        # ---- behind training: write
        policy_written: Any = None
        try:
            try:
                await afault_point("save.begin")
                await self._in_background(writer.begin)  # makes tmp_step_N/; checks the lease under the dir lock
                policy_written = trainer.write_captured.remote(str(writer.policy_dir))
                try:
                    await policy_written
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(exc.cause, OSError):  # e.g. a full disk: report it as the I/O error it is
                        raise exc.cause from None
                    raise
                await afault_point("save.policy")
                await self._in_background(torch_io.save, loader_state, writer.loader_path)
                await afault_point("save.loader")
                data_plane = await snapshot.write(executor=self._save_io)
            finally:
                await self.buffer.thaw()
            await afault_point("save.snapshot")
            await self._in_background(torch_io.save, meta, writer.sidecar_path)
            await afault_point("save.sidecar")
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
            known = {f"{layout.DATA_PLANE_DIR}/{name}": h for name, h in data_plane.get("files", {}).items()}
            final = await self._in_background(writer.commit, fields, known)
        except BaseException:
            if policy_written is not None:  # let the trainer's write end before its directory goes
                await asyncio.gather(policy_written, return_exceptions=True)
            await self._in_background(writer.abort)
            raise
        await afault_point("save.done")
        try:
            removed = await self._in_background(prune, root, cfg.checkpoint.keep, newest_verified=final)
        except OSError as exc:  # the bundle is published and verified; an old one left behind is no failed save
            log.warning("retention could not prune %s: %s; older bundles stay", root, exc)
            removed = []
        self._trace(ev="save", step=step, digest=captured["digest"], groups=captured["groups"])
        return {
            "bundle": final.name,
            "seconds": time.perf_counter() - t0,
            "blocked_seconds": blocked,
            "window_seconds": window,
            "groups": captured["groups"],
            "data_plane_bytes": data_plane["bytes"],
            "pruned": removed,
        }
