"""sc-app benchmarks: checkpoint and data-plane cost against the physical limit, side by side, in one run.

Run ``bench/run [--quick]`` from the repo root. One local Ray + one TransferQueue serve every section; each
section measures its candidates interleaved (A, B, A, B, ...) so drift on a noisy machine hits all alike, and
reports medians, ranges (min..max) and ratios. Sections (numbers as in issue 5):

1. data-plane save vs raw sequential write+fsync of the same bytes into the same directory; restore vs raw read
2. bundle bytes vs live tensor bytes after churn (groups committed and cleared between saves)
3. barrier exclusive window per save, p50/p99 commit wait while rollouts stream during the save
4. rows/s and steps/s of the real controller with checkpointing on vs off
5. resume-to-first-trained-step vs cold start (also with a bundle padded to the largest data-plane size)
6. TransferQueue put/get through the adapter vs plain ray.put/ray.get, 1 KiB and 1 MiB rows

Writes ``<out>/latest.json``, ``<out>/latest.md`` and PNG plots beside them. ``--quick`` runs the smallest size
only, with fewer repetitions; it still checks every result for correctness (row sets, bytes, round trips).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sc_app.progress import SaveRecord, StepRecord

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MiB = 1024 * 1024
ROW_BYTES = 1 * MiB  # data-plane rows for sections 1-3 and 5 (the "1 MiB rows")
GROUP = 8  # rows per group = rows per put (how the controller commits)
FULL_SIZES_MIB = [16, 64, 256, 1024]
QUICK_SIZES_MIB = [16]
NATIVE_MAX_MIB = 256  # native saves above this are skipped: its bundle is ~8x the live bytes (and as much RAM)
STREAM_GROUP_BYTES = 8 * 1024  # a streaming rollout group during a save: 8 rows x 1 KiB
STREAM_INTERVAL_S = 0.005  # one streaming commit every 5 ms while a save runs
DEFAULT_SAVE_PERIOD = 10


class BenchError(AssertionError):
    """A benchmark produced a wrong result (not a slow one): the run fails."""


def check(cond: bool, what: str) -> None:
    if not cond:
        raise BenchError(what)


# ------------------------------------------------------------------------------------------------ statistics
def summary(xs: list[float]) -> dict[str, float]:
    """median, min, max, n of a sample."""
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def drop_cache(paths: list[Path]) -> None:
    """Evict files from the page cache (POSIX_FADV_DONTNEED) so reads hit the disk, for both sides alike."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in files_under(d))


# ------------------------------------------------------------------------------------------------ raw I/O
_PATTERN = os.urandom(8 * MiB)


def raw_write(path: Path, nbytes: int) -> float:
    """Sequential write of ``nbytes`` + fsync (file and directory); seconds."""
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        left = nbytes
        while left > 0:
            n = min(left, len(_PATTERN))
            f.write(memoryview(_PATTERN)[:n])
            left -= n
        os.fsync(f.fileno())
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return time.perf_counter() - t0


def raw_read(path: Path) -> float:
    """Sequential read of a whole file (page cache dropped first); seconds."""
    drop_cache([path])
    buf = bytearray(8 * MiB)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------ the harness
class Bench:
    def __init__(self, out: Path, work: Path, quick: bool) -> None:
        self.out = out
        self.work = work
        self.quick = quick
        self.sizes = QUICK_SIZES_MIB if quick else FULL_SIZES_MIB
        self.results: dict[str, Any] = {
            "quick": quick,
            "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "config": {
                "row_bytes": ROW_BYTES,
                "group_rows": GROUP,
                "sizes_mib": self.sizes,
                "stream_group_bytes": STREAM_GROUP_BYTES,
                "stream_interval_s": STREAM_INTERVAL_S,
                "default_save_period": DEFAULT_SAVE_PERIOD,
            },
        }

    # -------------------------------------------------------------------------------------------- setup
    def start(self) -> None:
        import ray

        t0 = time.perf_counter()
        logging.getLogger("transfer_queue").setLevel(logging.ERROR)
        ray.init(
            address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING
        )
        t1 = time.perf_counter()
        import transfer_queue as tq

        from sc_app.data_plane.transferqueue import tq_conf

        tq.init(tq_conf(1, None))
        self.tq = tq
        self.results["startup"] = {"ray_init_s": t1 - t0, "tq_init_s": time.perf_counter() - t1}

    def stop(self) -> None:
        import ray

        try:
            self.tq.close()
        finally:
            ray.shutdown()

    def clear_all(self) -> None:
        for part, rows in self.tq.kv_list().items():
            if rows:
                self.tq.kv_clear(keys=list(rows), partition_id=part)
        check(sum(len(v) for v in self.tq.kv_list().values()) == 0, "data plane not empty after clear")

    def client(self) -> Any:
        """A bootstrap adapter with a fresh guard (own namespace)."""
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        return TransferQueueDataPlane(bootstrap=True, namespace=f"bench-{uuid.uuid4().hex[:8]}")

    # -------------------------------------------------------------------------------------------- sections 1-3
    def data_plane(self) -> None:
        rows = []
        for size in self.sizes:
            print(f"[data plane] {size} MiB ...", flush=True)
            rows.append(asyncio.run(self._data_plane_size(size)))
            self.clear_all()
        self.results["data_plane"] = rows

    async def _data_plane_size(self, size_mib: int) -> dict[str, Any]:
        import torch
        from tensordict import TensorDict

        from sc_app.barrier import DataPlaneCheckpointBarrier
        from sc_app.data_plane.client import CapturedRows
        from sc_app.data_plane.streamed import load_streamed
        from sc_app.data_plane.streamed_format import iter_groups
        from sc_app.replay_buffer import TQReplayBuffer

        client = self.client()
        barrier = DataPlaneCheckpointBarrier()
        partition = f"dp{size_mib}"
        buffer = TQReplayBuffer(client, barrier, partition=partition, group_size=GROUP)
        per_row = ROW_BYTES // 4 - 1  # float32 payload + one float32 reward = ROW_BYTES per row
        live_groups = max(1, size_mib * MiB // (ROW_BYTES * GROUP))
        counter = 0

        def group_fields(seed: int) -> TensorDict:
            x = torch.empty(GROUP, per_row, dtype=torch.float32)
            x.fill_(float(seed))
            x[:, :4] = torch.arange(4, dtype=torch.float32) + seed
            return TensorDict({"x": x, "reward": torch.full((GROUP,), float(seed))}, batch_size=GROUP)

        async def commit_new(n: int) -> None:
            nonlocal counter
            for _ in range(n):
                await buffer.commit(f"g{counter}", counter, counter, group_fields(counter))
                counter += 1

        def live_bytes() -> int:
            return buffer.rows * ROW_BYTES

        # churn: fill, then rounds of "drop the oldest half, commit as many new groups" (what training does)
        t0 = time.perf_counter()
        await commit_new(live_groups)
        fill_s = time.perf_counter() - t0
        for _ in range(2):
            old = [g.group_id for g in buffer.groups()[: max(1, live_groups // 2)]]
            await buffer.drop(old)
            await commit_new(len(old))
        check(buffer.rows == live_groups * GROUP, "churn changed the number of live rows")

        stream_partition_ids: list[str] = []
        small = TensorDict({"y": torch.zeros(GROUP, STREAM_GROUP_BYTES // GROUP // 4)}, batch_size=GROUP)

        async def save(kind: str, directory: Path) -> dict[str, Any]:
            """One save the way the controller cuts it, with small rollout groups committing meanwhile."""
            waits_before = len(barrier.stats.mutation_waits)
            stop = asyncio.Event()
            latencies: list[float] = []
            stream_buffer = TQReplayBuffer(client, barrier, partition=partition + "s", group_size=GROUP)

            async def stream() -> None:
                i = 0
                while not stop.is_set():
                    t = time.perf_counter()
                    gid = f"s{kind}{uuid.uuid4().hex[:6]}{i}"
                    await stream_buffer.commit(gid, i, 0, small)
                    latencies.append(time.perf_counter() - t)
                    stream_partition_ids.append(gid)
                    i += 1
                    await asyncio.sleep(STREAM_INTERVAL_S)

            streamer = asyncio.create_task(stream())
            await asyncio.sleep(0.05)  # the stream is flowing before the save asks for the window
            client.snapshot = kind
            t0 = time.perf_counter()
            async with barrier.checkpoint():
                w0 = time.perf_counter()
                meta = buffer.metadata_state_dict()
                stored = await client.list_sample_ids(partition)
                check(stored == buffer.sample_ids(), "inventory mismatch before save")
                snap = await client.save_checkpoint(
                    directory, {"digest": meta["digest"], "step": counter}, partition, CapturedRows(sorted(stored))
                )
                window = time.perf_counter() - w0
                buffer.freeze(stored)
            try:
                stats = await snap.write()
            finally:
                await buffer.thaw()
            total = time.perf_counter() - t0
            await asyncio.sleep(0.05)
            stop.set()
            await streamer
            waits = barrier.stats.mutation_waits[waits_before:]
            # drop the streamed groups again so the next measurement sees the same live set
            await stream_buffer.drop([g.group_id for g in stream_buffer.groups()])
            return {
                "seconds": total,
                "window_s": window,
                "write_s": total - window,
                "bundle_bytes": tree_bytes(directory),
                "commit_waits": waits,
                "commit_latencies": latencies,
                "rows": stats["rows"],
            }

        live = live_bytes()
        reps = 1 if self.quick else (2 if size_mib >= 1024 else 3)
        base = self.work / f"dp{size_mib}"
        base.mkdir(parents=True, exist_ok=True)
        streamed: list[dict[str, Any]] = []
        native: list[dict[str, Any]] = []
        raw_w: list[float] = []
        run_native = size_mib <= NATIVE_MAX_MIB
        for r in range(reps):
            d = base / f"streamed{r}"
            streamed.append(await save("streamed", d))
            if r < reps - 1:
                shutil.rmtree(d)
            raw_path = base / "raw.bin"
            raw_w.append(await asyncio.to_thread(raw_write, raw_path, live))
            if r < reps - 1:
                raw_path.unlink()
            if run_native:
                nd = base / "native"
                if nd.exists():
                    shutil.rmtree(nd)
                native.append(await save("native", nd))

        sdir = base / f"streamed{reps - 1}"
        ndir = base / "native" if native else None
        check(all(s["rows"] == live_groups * GROUP for s in streamed), "streamed snapshot row count")
        ids_on_disk = [sid for g in iter_groups(sdir) for sid in g.ids]
        check(set(ids_on_disk) == buffer.sample_ids(), "streamed snapshot != captured index")
        check(len(ids_on_disk) == len(set(ids_on_disk)), "streamed snapshot repeats a row")
        expected = {g.group_id: int(g.group_id[1:]) for g in buffer.groups()}

        # restore: clear the data plane, put the snapshot back (same code the adapter runs), check, repeat
        raw_path = base / "raw.bin"
        restore_s: list[float] = []
        native_restore_s: list[float] = []
        raw_r: list[float] = []
        for r in range(reps):
            self.clear_all()
            drop_cache(files_under(sdir))
            t0 = time.perf_counter()
            load_streamed(self.tq, sdir)
            restore_s.append(time.perf_counter() - t0)
            listing = self.tq.kv_list(partition).get(partition, {})
            check(set(listing) == set(ids_on_disk), "restored rows != snapshot rows")
            probe = sorted(expected)[r % len(expected)]
            got = self.tq.kv_batch_get(keys=[f"{probe}:{i}" for i in range(GROUP)], partition_id=partition)
            want = group_fields(expected[probe])
            check(bool(torch.equal(got["reward"], want["reward"])), "restored reward differs")
            xv = got["x"].values() if got["x"].is_nested else got["x"].reshape(-1)
            check(bool(torch.equal(xv.reshape(GROUP, -1), want["x"])), "restored payload differs")
            check(listing[f"{probe}:0"] == {"group": probe, "version": expected[probe]}, "restored tags differ")
            raw_r.append(await asyncio.to_thread(raw_read, raw_path))
            if ndir is not None:
                self.clear_all()
                drop_cache(files_under(ndir))
                t0 = time.perf_counter()
                await asyncio.to_thread(self.tq.load_checkpoint, str(ndir))
                native_restore_s.append(time.perf_counter() - t0)
                check(len(self.tq.kv_list(partition).get(partition, {})) == len(ids_on_disk), "native restore rows")
        shutil.rmtree(base)

        def bw(nbytes: float, secs: list[float]) -> dict[str, float]:
            return summary([nbytes / s / MiB for s in secs])

        def collect(saves: list[dict[str, Any]]) -> dict[str, Any]:
            waits = [w for s in saves for w in s["commit_waits"]]
            lats = [x for s in saves for x in s["commit_latencies"]]
            return {
                "save_s": summary([s["seconds"] for s in saves]),
                "save_mib_s": bw(live, [s["seconds"] for s in saves]),
                "window_ms": summary([s["window_s"] * 1e3 for s in saves]),
                "bundle_bytes": saves[-1]["bundle_bytes"],
                "bundle_over_live": saves[-1]["bundle_bytes"] / live,
                "commit_wait_ms": {"p50": percentile(waits, 50) * 1e3, "p99": percentile(waits, 99) * 1e3},
                "commit_latency_ms": {"p50": percentile(lats, 50) * 1e3, "p99": percentile(lats, 99) * 1e3},
                "commits_during_saves": len(waits),
            }

        out: dict[str, Any] = {
            "size_mib": size_mib,
            "live_bytes": live,
            "groups": live_groups,
            "fill_mib_s": live / fill_s / MiB,
            "raw_write_mib_s": bw(live, raw_w),
            "raw_read_mib_s": bw(live, raw_r),
            "streamed": collect(streamed),
            "streamed_restore_mib_s": bw(live, restore_s),
        }
        out["streamed"]["save_over_raw"] = out["streamed"]["save_mib_s"]["median"] / out["raw_write_mib_s"]["median"]
        out["streamed"]["restore_over_raw"] = out["streamed_restore_mib_s"]["median"] / out["raw_read_mib_s"]["median"]
        if native:
            out["native"] = collect(native)
            out["native"]["save_over_raw"] = out["native"]["save_mib_s"]["median"] / out["raw_write_mib_s"]["median"]
            if native_restore_s:
                out["native_restore_mib_s"] = bw(live, native_restore_s)
                out["native"]["restore_over_raw"] = (
                    out["native_restore_mib_s"]["median"] / out["raw_read_mib_s"]["median"]
                )
        return out

    # -------------------------------------------------------------------------------------------- section 6
    def put_get(self) -> None:
        print("[put/get] adapter vs ray.put/ray.get ...", flush=True)
        self.results["put_get"] = asyncio.run(self._put_get())
        self.clear_all()

    async def _put_get(self) -> list[dict[str, Any]]:
        import ray
        import torch
        from tensordict import TensorDict

        client = self.client()
        out = []
        for row_bytes, total in (
            (1024, 4 * MiB if self.quick else 16 * MiB),
            (MiB, 32 * MiB if self.quick else 256 * MiB),
        ):
            rows_per_put = GROUP
            n_puts = max(4, total // (row_bytes * rows_per_put))
            td = TensorDict({"x": torch.randn(rows_per_put, row_bytes // 4)}, batch_size=rows_per_put)
            part = f"pg{row_bytes}"
            reps = 1 if self.quick else 3
            res: dict[str, list[float]] = {"tq_put": [], "tq_get": [], "ray_put": [], "ray_get": []}
            for rep in range(reps):
                ids = [[f"r{rep}g{i}:{j}" for j in range(rows_per_put)] for i in range(n_puts)]
                t0 = time.perf_counter()
                for k in ids:
                    await client.put_samples(part, k, td)
                res["tq_put"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for k in ids:
                    got = await client.get_samples(part, k)
                res["tq_get"].append(time.perf_counter() - t0)
                check(bool(torch.equal(got["x"], td["x"])), "adapter get returned other bytes")
                await client.clear_samples(part, [s for k in ids for s in k])
                t0 = time.perf_counter()
                refs = [ray.put(td["x"]) for _ in range(n_puts)]
                res["ray_put"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for ref in refs:
                    got_x = ray.get(ref)
                res["ray_get"].append(time.perf_counter() - t0)
                check(bool(torch.equal(got_x, td["x"])), "ray.get returned other bytes")
                del refs, got_x
            nbytes = n_puts * rows_per_put * row_bytes
            entry: dict[str, Any] = {"row_bytes": row_bytes, "rows_per_op": rows_per_put, "ops": n_puts}
            for key, secs in res.items():
                entry[key] = {
                    "mib_s": summary([nbytes / s / MiB for s in secs]),
                    "rows_s": summary([n_puts * rows_per_put / s for s in secs]),
                }
            entry["put_over_ray"] = entry["tq_put"]["mib_s"]["median"] / entry["ray_put"]["mib_s"]["median"]
            entry["get_over_ray"] = entry["tq_get"]["mib_s"]["median"] / entry["ray_get"]["mib_s"]["median"]
            out.append(entry)
        return out

    # -------------------------------------------------------------------------------------------- sections 4-5
    def _cfg(self, ckpt_dir: Path, *, steps: int, enabled: bool, partition: str) -> Any:
        from sc_app.config import AppConfig

        return AppConfig.model_validate(
            {
                "run": {"max_steps": steps, "trace_file": str(ckpt_dir.parent / f"{ckpt_dir.name}.trace")},
                "ray": {"namespace": f"bench-{uuid.uuid4().hex[:8]}"},
                "data_plane": {"partition": partition},
                "checkpoint": {"dir": str(ckpt_dir), "enabled": enabled, "keep": 2},
            }
        )

    def _run_controller(self, cfg: Any) -> dict[str, Any]:
        """Plan, set up (restore if there is a bundle), run to max_steps; times from setup to each step."""
        import ray

        from sc_app import driver
        from sc_app.checkpoint import hmac_key_from_env, plan_resume
        from sc_app.checkpoint.compat import compat_of
        from sc_app.driver import setup_single_controller

        self.clear_all()
        phases: dict[str, float] = {}

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    phases[name] = time.perf_counter() - t

            return wrapper

        originals = (driver.TQPolicy.trainer_state_loaded, driver.TQPolicy.load_data_plane_checkpoint)
        t0 = time.perf_counter()
        plan = plan_resume(
            cfg.checkpoint.dir, policy="strict", hmac_key=hmac_key_from_env(), expected_compat=compat_of(cfg)
        )
        check(plan.decision in ("fresh", "resume"), f"plan refused: {plan.reason}")
        t_plan = time.perf_counter()
        # bench-only instrumentation: how long the two restore phases of setup take
        # the trainers start + load while the driver restores the data plane; "trainer_load_s" is the wait after
        driver.TQPolicy.trainer_state_loaded = timed("trainer_load_s", originals[0])  # type: ignore[method-assign]
        driver.TQPolicy.load_data_plane_checkpoint = timed("data_plane_restore_s", originals[1])  # type: ignore[method-assign]
        try:
            setup = setup_single_controller(cfg, plan, run_id=uuid.uuid4().hex[:12])
        finally:
            driver.TQPolicy.trainer_state_loaded, driver.TQPolicy.load_data_plane_checkpoint = originals  # type: ignore[method-assign]
        t_setup = time.perf_counter()
        ref = setup.actor.run.remote()
        records: list[dict[str, Any]] = []
        first_step_at = None
        while True:
            ready, _ = ray.wait([ref], timeout=0.02)
            new = ray.get(setup.actor.progress.remote(len(records)))
            if new and first_step_at is None:
                first_step_at = time.perf_counter()
            records.extend(new)
            if ready:
                break
        summary_ = ray.get(ref)
        end = time.perf_counter()
        for actor in [setup.actor, *setup.policy.trainers, *setup.policy.generators]:
            ray.kill(actor)
        trace = [json.loads(line) for line in Path(cfg.run.trace_file).read_text().splitlines()]
        started = next(e["t"] for e in trace if e.get("ev") == "start")
        first_train = next(e["t"] for e in trace if e.get("ev") == "train")
        return {
            "actor_to_first_step_s": first_train - started,
            "trainer_load_s": phases.get("trainer_load_s", 0.0),
            "data_plane_restore_s": phases.get("data_plane_restore_s", 0.0),
            "decision": plan.decision,
            "plan_s": t_plan - t0,
            "setup_s": t_setup - t_plan,
            "first_step_s": (first_step_at or end) - t0,
            "total_s": end - t0,
            "records": records,
            "trace": trace,
            "summary": summary_,
        }

    def end_to_end(self) -> None:
        """Sections 4-5. Full: off/on/off/on runs, 2x cold vs resume, one padded resume.
        Quick: one "on" run and one padded resume (correctness only; each run costs a worker cold start)."""
        print("[end to end] checkpointing on vs off, resume vs cold ...", flush=True)
        steps = 6 if self.quick else 120
        warm = 2
        order = ["on"] if self.quick else ["off", "on", "off", "on"]
        runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
        last_on_dir: Path | None = None
        for i, mode in enumerate(order):
            d = self.work / f"e2e_{mode}{i}"
            cfg = self._cfg(d, steps=steps, enabled=mode == "on", partition="e2e")
            res = self._run_controller(cfg)
            trains = [e for e in res["trace"] if e.get("ev") == "train"]
            check(len(trains) == steps, f"{mode} run trained {len(trains)} of {steps} steps")
            span = trains[-1]["t"] - trains[warm - 1]["t"]
            saves = [r for r in res["records"] if isinstance(r, SaveRecord)]
            cost = save_cost(res["records"], res["trace"], warm)
            if mode == "on":
                want = steps // DEFAULT_SAVE_PERIOD + (steps % DEFAULT_SAVE_PERIOD != 0)
                check(len(saves) == want, f"on run cut {len(saves)} bundles, expected {want}")
                last_on_dir = d
            runs[mode].append(
                {
                    "steps_s": (steps - warm) / span,
                    "step_s": statistics.median(
                        r.step_seconds for r in res["records"] if isinstance(r, StepRecord) and r.step > warm
                    ),
                    "save_s": [s.seconds for s in saves],
                    "blocked_s": [s.blocked_seconds for s in saves],
                    "window_ms": [s.window_seconds * 1e3 for s in saves],
                    "save_cost_s": cost,
                    "span_s": span,
                    "first_step_s": res["first_step_s"],
                }
            )
        rows_per_step = 8 * 8  # grpo defaults: prompts_per_step x num_generations_per_prompt
        step_s = statistics.median(r["step_s"] for r in runs["off"] + runs["on"])
        windows = [w for r in runs["on"] for w in r["window_ms"]]
        save_s = [s for r in runs["on"] for s in r["save_s"]]
        blocked_s = [s for r in runs["on"] for s in r["blocked_s"]]
        e2e: dict[str, Any] = {
            "steps": steps,
            "save_period": DEFAULT_SAVE_PERIOD,
            "step_s": step_s,
            "steps_s_on": summary([r["steps_s"] for r in runs["on"]]),
            "rows_s_on": summary([r["steps_s"] * rows_per_step for r in runs["on"]]),
            "save_s": summary(save_s),
            "blocked_s": summary(blocked_s),
            "window_ms": summary(windows),
            "window_over_step": statistics.median(windows) / 1e3 / step_s,
            "window_over_period": statistics.median(windows) / 1e3 / (step_s * DEFAULT_SAVE_PERIOD),
            # in-run accounting, immune to drift between runs: training paused for the save + how much slower
            # the steps that overlapped its background write were than the run's other steps, over the span
            "overhead_accounted": statistics.median(
                [r["save_cost_s"] / r["span_s"] for r in runs["on"] if r["span_s"] > 0]
            ),
        }
        if runs["off"]:
            e2e["steps_s_off"] = summary([r["steps_s"] for r in runs["off"]])
            e2e["rows_s_off"] = summary([r["steps_s"] * rows_per_step for r in runs["off"]])
            e2e["overhead_measured"] = 1 - e2e["steps_s_on"]["median"] / e2e["steps_s_off"]["median"]

        assert last_on_dir is not None
        if not self.quick:  # resume vs cold: same config; cold = empty dir, resume = the "on" run's newest bundle
            cold: list[float] = []
            cold_actor: list[float] = []
            resume: list[float] = []
            resume_work: list[float] = []
            for rep in range(2):
                cd = self.work / f"cold{rep}"
                cres = self._run_controller(self._cfg(cd, steps=1, enabled=False, partition="e2e"))
                cold.append(cres["first_step_s"])
                cold_actor.append(cres["actor_to_first_step_s"])
                shutil.rmtree(cd, ignore_errors=True)
                rd = self.work / f"resume{rep}"
                shutil.copytree(last_on_dir, rd)
                res = self._run_controller(self._cfg(rd, steps=steps + 1, enabled=False, partition="e2e"))
                check(res["decision"] == "resume", "resume run did not resume")
                check(res["records"][0].step == steps + 1, "resume did not continue from the bundle's step")
                resume.append(res["first_step_s"])
                resume_work.append(res["trainer_load_s"] + res["data_plane_restore_s"] + res["actor_to_first_step_s"])
                shutil.rmtree(rd, ignore_errors=True)
            e2e["cold_first_step_s"] = summary(cold)
            e2e["resume_first_step_s"] = summary(resume)
            e2e["resume_over_cold"] = e2e["resume_first_step_s"]["median"] / e2e["cold_first_step_s"]["median"]
            e2e["cold_actor_to_first_step_s"] = summary(cold_actor)
            e2e["resume_restore_work_s"] = summary(resume_work)

        # resume with the bundle's data plane padded to the largest size (same rows, one extra field per group)
        big = self.sizes[-1]
        padded = self.work / "resume_big"
        bundle_bytes = pad_bundle(last_on_dir, padded, big * MiB)
        raw_path = self.work / "raw_big.bin"
        raw_write(raw_path, bundle_bytes)
        raw_read_s = raw_read(raw_path)
        raw_path.unlink()
        drop_cache(files_under(padded))
        res = self._run_controller(self._cfg(padded, steps=steps + 1, enabled=False, partition="e2e"))
        check(res["decision"] == "resume" and res["records"][0].step == steps + 1, "padded resume")
        big_res: dict[str, Any] = {
            "data_plane_mib": bundle_bytes / MiB,
            "first_step_s": res["first_step_s"],
            "verify_s": res["plan_s"],
            "first_step_after_verify_s": res["first_step_s"] - res["plan_s"],
            "raw_read_s": raw_read_s,
            "trainer_load_s": res["trainer_load_s"],
            "data_plane_restore_s": res["data_plane_restore_s"],
            "actor_to_first_step_s": res["actor_to_first_step_s"],
            "restore_work_s": res["trainer_load_s"] + res["data_plane_restore_s"] + res["actor_to_first_step_s"],
            "startup_s": res["first_step_s"]
            - res["plan_s"]
            - res["trainer_load_s"]
            - res["data_plane_restore_s"]
            - res["actor_to_first_step_s"],
        }
        if "cold_first_step_s" in e2e:
            cold_s = e2e["cold_first_step_s"]["median"]
            big_res["budget_s"] = (cold_s + raw_read_s) * 1.1
            big_res["over_cold_s"] = big_res["first_step_after_verify_s"] - cold_s
            # noise-robust form: the resume-only work vs what a cold start does in its place, + bytes/raw read
            cold_work = e2e["cold_actor_to_first_step_s"]["median"]
            big_res["work_budget_s"] = cold_work + raw_read_s + 0.1 * cold_s
        e2e["resume_big"] = big_res
        shutil.rmtree(padded, ignore_errors=True)
        for i, mode in enumerate(order):
            shutil.rmtree(self.work / f"e2e_{mode}{i}", ignore_errors=True)
        self.results["end_to_end"] = e2e


def save_cost(records: list[Any], trace: list[dict[str, Any]], warm: int) -> float:
    """Seconds a run lost to saving: the time training was paused for each save (``blocked_seconds``) plus,
    for the steps a save touched — the step it was cut at (the trainer copies its state inside it) and those
    that ran while its background write was in flight — their excess over the *mean* of the steps no save
    touched (signed, so noise cancels; not the median: step times are right-skewed, and against the median
    an ordinary step counts as slowed down)."""
    step_s = {r.step: r.step_seconds for r in records if isinstance(r, StepRecord) and r.step > warm}
    trained_at = {e["step"]: e["t"] for e in trace if e.get("ev") == "train"}
    saved_at = {e["step"]: e["t"] for e in trace if e.get("ev") == "save"}
    overlapped: set[int] = set()
    paused = 0.0
    for r in records:
        if not isinstance(r, SaveRecord):
            continue
        step = r.step
        paused += r.blocked_seconds
        begin = trained_at.get(step, 0.0) + r.blocked_seconds
        end = saved_at.get(step, begin)
        overlapped |= {n for n, t in trained_at.items() if n in step_s and t > begin and t - step_s[n] < end}
        overlapped |= {step} & set(step_s)
    clean = [v for n, v in step_s.items() if n not in overlapped]
    if not clean:
        return paused
    base = statistics.fmean(clean)
    return paused + sum(step_s[n] - base for n in overlapped)


def pad_bundle(src: Path, dst_root: Path, data_plane_bytes: int) -> int:
    """Copy the newest bundle under ``src`` into ``dst_root`` with every group given an extra ``pad`` field so
    its data plane holds ~``data_plane_bytes``; the manifest is re-rendered over the new files. Returns bytes."""
    import torch

    from sc_app.checkpoint import layout
    from sc_app.checkpoint.manifest import render
    from sc_app.data_plane.streamed_format import PartWriter, iter_groups, read_metadata
    from sc_app.durable_io import sha256_file

    _, bundle = layout.step_dirs(src)[0]
    dst = dst_root / bundle.name
    shutil.copytree(bundle, dst)
    dp = dst / layout.DATA_PLANE_DIR
    doc = read_metadata(dp)
    groups = list(iter_groups(dp, doc))
    rows = sum(len(g.ids) for g in groups)
    per_row = max(1, data_plane_bytes // max(1, rows))
    for p in list(dp.iterdir()):
        if p.name != "metadata.json":
            p.unlink()
    writer = PartWriter(dp, 64 * MiB)
    for group in groups:
        data = group.data.clone()
        data["pad"] = torch.full((len(group.ids), per_row), 7, dtype=torch.uint8)
        writer.append(group.group, group.ids, group.tags, data)
    writer.finish()
    (dp / "metadata.json").write_text(json.dumps({**doc, "parts": writer.parts, "bytes": writer.bytes}, indent=1))
    manifest = json.loads((dst / layout.MANIFEST_FILE).read_text())
    files = {}
    for p in sorted(dst.rglob("*")):
        if p.is_file() and p.name != layout.MANIFEST_FILE:
            digest, size = sha256_file(p)
            files[p.relative_to(dst).as_posix()] = {"sha256": digest, "size": size}
    manifest["files"] = files
    manifest.pop("signature", None)
    (dst / layout.MANIFEST_FILE).write_bytes(render(manifest, None))
    return writer.bytes


# ------------------------------------------------------------------------------------------------ report
TARGETS = {
    "save_over_raw": 0.8,
    "restore_over_raw": 0.8,
    "bundle_over_live": 1.1,
    "window_over_period": 0.05,
    "p99_commit_wait_ms": 50.0,
    "overhead": 0.02,
}


def fmt(x: float, nd: int = 2) -> str:
    return "—" if x is None or x != x else f"{x:.{nd}f}"


def rng(s: dict[str, float], nd: int = 0) -> str:
    if s["n"] <= 1:
        return fmt(s["median"], nd)
    return f"{fmt(s['median'], nd)} ({fmt(s['min'], nd)}-{fmt(s['max'], nd)})"


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def render_markdown(res: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add(
        f"Run: `bench/run{' --quick' if res['quick'] else ''}` — {res['host']['cpus']} CPUs, "
        f"Python {res['host']['python']}, {res['finished_at']}, {res['wall_s']:.0f} s wall."
    )
    if res.get("merged_from"):
        add(f"Sections this run skipped are kept from the run finished at {res['merged_from']}.")
    add("Values: median (min-max) over repetitions; MiB/s of live tensor bytes.")
    add("")
    add("### 1-3. Data plane: save / restore throughput, bundle size, commit stall (1 MiB rows, 8-row groups)")
    add("")
    add(
        "| live MiB | raw write | streamed save | xraw | native save | xraw | raw read | streamed restore | xraw "
        "| native restore | xraw | bundle/live streamed | native | window ms streamed | native "
        "| p99 commit wait ms streamed | native |"
    )
    add("|" + "---|" * 17)
    for r in res["data_plane"]:
        s, n = r["streamed"], r.get("native")
        nn = n or {}
        add(
            f"| {r['size_mib']} | {rng(r['raw_write_mib_s'])} | {rng(s['save_mib_s'])} | {fmt(s['save_over_raw'])} "
            f"| {rng(nn['save_mib_s']) if n else '—'} | {fmt(nn.get('save_over_raw', float('nan')))} "
            f"| {rng(r['raw_read_mib_s'])} | {rng(r['streamed_restore_mib_s'])} | {fmt(s['restore_over_raw'])} "
            f"| {rng(r['native_restore_mib_s']) if 'native_restore_mib_s' in r else '—'} "
            f"| {fmt(nn.get('restore_over_raw', float('nan')))} "
            f"| {fmt(s['bundle_over_live'], 3)} | {fmt(nn.get('bundle_over_live', float('nan')), 2)} "
            f"| {rng(s['window_ms'], 1)} | {rng(nn['window_ms'], 0) if n else '—'} "
            f"| {fmt(s['commit_wait_ms']['p99'], 1)} | {fmt(nn['commit_wait_ms']['p99'], 0) if n else '—'} |"
        )
    add("")
    e = res.get("end_to_end")
    if e:
        off = e.get("steps_s_off")
        add(f"### 4-5. Real controller (default config, {e['steps']} steps, save_period={e['save_period']})")
        add("")
        add("| metric | checkpointing off | checkpointing on | ratio |")
        add("|---|---|---|---|")
        ratio = fmt(e["steps_s_on"]["median"] / off["median"], 3) if off else "-"
        add(f"| steps/s | {rng(off, 2) if off else '-'} | {rng(e['steps_s_on'], 2)} | {ratio} |")
        add(f"| rows/s | {rng(e['rows_s_off'], 0) if off else '-'} | {rng(e['rows_s_on'], 0)} | |")
        if off:
            add(f"| overhead: throughput drop between runs | | {fmt(100 * e['overhead_measured'], 1)} % | |")
        add(
            "| overhead, accounted in-run: training paused + slowdown of the steps a save touched "
            f"| | {fmt(100 * e['overhead_accounted'], 2)} % | |"
        )
        add(f"| step time (median) | {fmt(e['step_s'] * 1e3, 0)} ms | | |")
        add(f"| seconds per save (whole bundle, mostly in the background) | | {rng(e['save_s'], 3)} | |")
        if "blocked_s" in e:
            add(f"| training paused per save (loader place, window) | | {rng(e['blocked_s'], 3)} s | |")
        add(
            f"| exclusive window | | {rng(e['window_ms'], 2)} ms | {fmt(100 * e['window_over_step'], 2)} % of a step, "
            f"{fmt(100 * e['window_over_period'], 3)} % of a save period |"
        )
        add("")
        add("| start | to first trained step (s) | x cold |")
        add("|---|---|---|")
        cold = e.get("cold_first_step_s")
        if cold:
            add(f"| cold (no bundle) | {rng(cold, 2)} | 1.00 |")
            add(f"| resume (real bundle) | {rng(e['resume_first_step_s'], 2)} | {fmt(e['resume_over_cold'])} |")
        b = e["resume_big"]
        vs = fmt(b["first_step_after_verify_s"] / cold["median"]) if cold else "-"
        add(
            f"| resume, data plane padded to {b['data_plane_mib']:.0f} MiB | {fmt(b['first_step_after_verify_s'])} "
            f"+ {fmt(b['verify_s'])} bundle verify | {vs} |"
        )
        if "budget_s" in b:
            add(f"| target for it: (cold + bytes / raw read) x 1.1 | {fmt(b['budget_s'])} | |")
        add("")
        add("Where the padded resume's time went (s):")
        add("")
        add(
            "| bundle verify | data-plane restore (trainers start + load meanwhile) | wait for trainers after it "
            "| other setup (generators, weight sync, controller actor) | actor start to first step |"
        )
        add("|---|---|---|---|---|")
        add(
            f"| {fmt(b['verify_s'])} | {fmt(b['data_plane_restore_s'])} | {fmt(b['trainer_load_s'])} "
            f"| {fmt(b['startup_s'])} | {fmt(b['actor_to_first_step_s'])} |"
        )
        add("")
    pg = res.get("put_get")
    if pg:
        add("### 6. TransferQueue through the adapter vs plain ray.put / ray.get (8 rows per op)")
        add("")
        add(
            "| row | adapter put MiB/s | ray.put MiB/s | xray | adapter get MiB/s | ray.get MiB/s | xray "
            "| adapter put rows/s | adapter get rows/s |"
        )
        add("|---|---|---|---|---|---|---|---|---|")
        for p in pg:
            row = "1 KiB" if p["row_bytes"] == 1024 else "1 MiB"
            add(
                f"| {row} | {rng(p['tq_put']['mib_s'])} | {rng(p['ray_put']['mib_s'])} | {fmt(p['put_over_ray'], 3)} "
                f"| {rng(p['tq_get']['mib_s'])} | {rng(p['ray_get']['mib_s'])} | {fmt(p['get_over_ray'], 3)} "
                f"| {rng(p['tq_put']['rows_s'])} | {rng(p['tq_get']['rows_s'])} |"
            )
        add("")
    add("### Targets")
    add("")
    add("| target | measured (streamed) | verdict |")
    add("|---|---|---|")
    for t in res["targets"]:
        add(f"| {t['target']} | {t['measured']} | {verdict(t['ok'])} |")
    add("")
    return "\n".join(lines)


def evaluate_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    dp = res["data_plane"]
    out = []

    def add(target: str, values: list[float], ok: bool, unit: str = "") -> None:
        shown = ", ".join(f"{v:.3g}{unit}" for v in values)
        out.append({"target": target, "measured": shown + " (per size, smallest first)", "ok": ok, "values": values})

    save = [r["streamed"]["save_over_raw"] for r in dp]
    add("save >= 0.8x raw write", save, all(v >= 0.8 for v in save), "x")
    rest = [r["streamed"]["restore_over_raw"] for r in dp]
    add("restore >= 0.8x raw read", rest, all(v >= 0.8 for v in rest), "x")
    bundle = [r["streamed"]["bundle_over_live"] for r in dp]
    add("bundle <= 1.1x live after churn", bundle, all(v <= 1.1 for v in bundle), "x")
    p99 = [r["streamed"]["commit_wait_ms"]["p99"] for r in dp]
    add("p99 commit wait during a save <= 50 ms, any size", p99, all(v <= 50 for v in p99), " ms")
    e = res.get("end_to_end")
    if e:
        win = [r["streamed"]["window_ms"]["median"] / 1e3 / (e["step_s"] * DEFAULT_SAVE_PERIOD) for r in dp]
        add(
            "window <= 5% of step time at the default save period (data-plane sizes)",
            [100 * w for w in win],
            all(w <= 0.05 for w in win),
            " %",
        )
        add(
            "checkpointing overhead <= 2% (accounted in-run: paused + slowdown of the steps a save touched)",
            [100 * e["overhead_accounted"]],
            e["overhead_accounted"] <= 0.02,
            " %",
        )
        b = e["resume_big"]
        if "budget_s" in b:
            add(
                "resume <= (cold + bytes/raw read) x 1.1 (padded bundle; verify not counted)",
                [b["first_step_after_verify_s"], b["budget_s"]],
                b["first_step_after_verify_s"] <= b["budget_s"],
                " s",
            )
            add(
                "same, startup noise removed: trainer load + restore + first step <= cold's first step "
                "+ bytes/raw read + 10% of cold",
                [b["restore_work_s"], b["work_budget_s"]],
                b["restore_work_s"] <= b["work_budget_s"],
                " s",
            )
    return out


def plot(res: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    dp = res["data_plane"]

    def series(get: Callable[[dict[str, Any]], float | None]) -> tuple[list[int], list[float]]:
        xs, ys = [], []
        for r in dp:
            try:
                v = get(r)
            except KeyError:
                v = None
            if v is not None:
                xs.append(r["size_mib"])
                ys.append(v)
        return xs, ys

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for label, get, style in (
        ("raw write+fsync", lambda r: r["raw_write_mib_s"]["median"], "k--"),
        ("streamed save", lambda r: r["streamed"]["save_mib_s"]["median"], "C0o-"),
        ("native save", lambda r: r["native"]["save_mib_s"]["median"], "C3s-"),
    ):
        ax.plot(*series(get), style, label=label)
    ax.set(xscale="log", xlabel="live data-plane MiB", ylabel="MiB/s of live bytes", title="save")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1]
    for label, get, style in (
        ("raw read (cache dropped)", lambda r: r["raw_read_mib_s"]["median"], "k--"),
        ("streamed restore", lambda r: r["streamed_restore_mib_s"]["median"], "C0o-"),
        ("native restore", lambda r: r["native_restore_mib_s"]["median"], "C3s-"),
    ):
        ax.plot(*series(get), style, label=label)
    ax.set(xscale="log", xlabel="live data-plane MiB", ylabel="MiB/s of live bytes", title="restore")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    made.append("throughput.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.plot(*series(lambda r: r["streamed"]["bundle_over_live"]), "C0o-", label="streamed")
    ax.plot(*series(lambda r: r["native"]["bundle_over_live"]), "C3s-", label="native")
    ax.axhline(1.1, color="k", ls=":", label="target 1.1x")
    ax.set(xscale="log", xlabel="live data-plane MiB", ylabel="bundle bytes / live bytes", title="bundle size")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1]
    ax.plot(*series(lambda r: r["streamed"]["window_ms"]["median"]), "C0o-", label="window, streamed")
    ax.plot(*series(lambda r: r["native"]["window_ms"]["median"]), "C3s-", label="window, native")
    ax.plot(*series(lambda r: r["streamed"]["commit_wait_ms"]["p99"]), "C0^:", label="p99 commit wait, streamed")
    ax.plot(*series(lambda r: r["native"]["commit_wait_ms"]["p99"]), "C3v:", label="p99 commit wait, native")
    ax.axhline(50, color="k", ls=":", label="50 ms")
    ax.set(xscale="log", yscale="log", xlabel="live data-plane MiB", ylabel="ms", title="commit stall during a save")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "stall_and_size.png", dpi=110)
    plt.close(fig)
    made.append("stall_and_size.png")

    e = res.get("end_to_end")
    pg = res.get("put_get")
    if e or pg:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        if e:
            ax = axes[0]
            names, vals, colors = [], [], []
            if "cold_first_step_s" in e:
                names += ["cold", "resume"]
                vals += [e["cold_first_step_s"]["median"], e["resume_first_step_s"]["median"]]
                colors += ["0.6", "C0"]
            b = e["resume_big"]
            names += [f"resume, {b['data_plane_mib']:.0f} MiB\n(after verify)", "bundle verify"]
            vals += [b["first_step_after_verify_s"], b["verify_s"]]
            colors += ["C2", "C1"]
            ax.bar(names, vals, color=colors)
            title = "time to first trained step"
            if "steps_s_off" in e:
                title += f"\nsteps/s off {e['steps_s_off']['median']:.2f}, on {e['steps_s_on']['median']:.2f}"
            ax.set(ylabel="seconds", title=title)
            ax.tick_params(axis="x", labelsize=8)
        if pg:
            ax = axes[1]
            names = ["adapter put", "ray.put", "adapter get", "ray.get"]
            keys = ["tq_put", "ray_put", "tq_get", "ray_get"]
            width = 0.35
            for i, p in enumerate(pg):
                xs = [k + i * width for k in range(4)]
                label = "1 KiB rows" if p["row_bytes"] == 1024 else "1 MiB rows"
                ax.bar(xs, [p[k]["mib_s"]["median"] for k in keys], width=width, label=label)
            ax.set_xticks([k + width / 2 for k in range(4)], names)
            ax.set(yscale="log", ylabel="MiB/s", title="put/get: adapter vs plain Ray")
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / "controller_and_putget.png", dpi=110)
        plt.close(fig)
        made.append("controller_and_putget.png")
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smallest size only, fewer repetitions")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where latest.{json,md} go")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory for bundles (default: a temp dir)")
    ap.add_argument("--skip", action="append", default=[], choices=["data_plane", "put_get", "end_to_end"])
    ap.add_argument("--merge", action="store_true", help="keep sections of <out>/latest.json this run skips")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="sc-app-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.out, work, args.quick)
    started = time.perf_counter()
    bench.start()
    try:
        if "data_plane" not in args.skip:
            bench.data_plane()
        if "put_get" not in args.skip:
            bench.put_get()
        if "end_to_end" not in args.skip:
            bench.end_to_end()
    finally:
        bench.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    res = bench.results
    res["wall_s"] = time.perf_counter() - started
    previous = args.out / "latest.json"
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        for key in ("data_plane", "put_get", "end_to_end"):
            if key not in res and key in old:
                res[key] = old[key]
        res["merged_from"] = old.get("finished_at")
    res["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["targets"] = evaluate_targets(res) if "data_plane" in res else []
    res["plots"] = plot(res, args.out) if "data_plane" in res else []
    md = render_markdown(res) if "data_plane" in res else ""
    (args.out / "latest.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (args.out / "latest.md").write_text(md + "\n")
    print(md)
    print(f"wrote {args.out / 'latest.json'}, {args.out / 'latest.md'}, plots: {', '.join(res['plots'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
