"""hf backend: sharded policy save (DCP) against a raw write of the same bytes, with 1 and 2 trainer ranks
writing in parallel, and the time training is paused per save. Side by side, in one run.

Run from the repo root: ``.venv/bin/python bench/hf_policy_save.py [--quick] [--out DIR] [--work DIR]``.
Each world size runs as that many gloo ranks (fresh processes, ``fsdp`` for 2 ranks, one unsharded rank for 1)
holding a random Llama built locally (nothing downloaded) with Adam state. Per repetition, interleaved (DCP, raw,
raw, DCP, ...), after a barrier:

* paused: ``HFTrainer.capture()`` — the CPU copy of the rank's shard a save takes inside the train step (the only
  part of a save training waits for);
* DCP save: ``HFTrainer.write_captured()`` into a fresh ``policy/`` — DCP plan + every rank writing its shard +
  fsync + the sha256 of what it wrote (what the bundle manifest then reuses);
* raw: each rank writes as many bytes as its DCP files hold, sequentially, + fsync of file and directory;
* DCP before: the same captured state written by ``policy_ckpt`` as it was when issue 30 was opened
  (``ISSUE30_BEFORE``, read from git; left out without the history) — the "before" of the save's CPU-seconds.

Each of the three is also measured in CPU-seconds: ``getrusage(RUSAGE_SELF)`` (user + system, every thread of the
rank process — DCP writes on the calling thread) before and after, summed over the ranks. Targets (issue 21): the
DCP save's CPU-seconds per GiB <= 1.5x the raw write's, and training paused <= 10 ms per 100 MiB of trainer state.

Throughput = all ranks' bytes / the slowest rank's seconds. Then the step time with a save written behind it on
the io thread (at the lowered priority the trainer actor gives it), against steps with none.
Writes ``<out>/hf_policy_save.json`` and ``<out>/hf_policy_save.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scbench.common import before_module, raw_write  # noqa: E402

MiB = 1024 * 1024
FULL_SPECS = {"small": {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4},
              "medium": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 8}}  # fmt: skip
QUICK_SPECS = {"small": FULL_SPECS["small"]}
P, R = 8, 8
ISSUE30_BEFORE = "408f378"  # main when issue 30 (DCP saves near a raw write) was taken up


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def write_behind(trainer: Any, d: Path) -> None:
    """What the trainer actor's io thread does: lower its own priority, then write."""
    from sc_app.io.background import lower_current_thread_priority

    lower_current_thread_priority()
    trainer.write_captured(d)


def cpu_now() -> float:
    """CPU-seconds (user + system) of this whole process so far: every thread of the rank."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def rank_main(rank: int, world: int, model_dir: str, work: str, reps: int, steps: int) -> dict[str, Any]:
    bench = RankBench(rank, world, model_dir)
    bench.step()  # Adam state exists from here on
    saves = bench.saves(Path(work), reps)
    plain, behind = bench.steps_behind(Path(work, "behind"), steps)
    params = sum(p.numel() for p in bench.trainer.hf_model.parameters()) if world == 1 else None
    return {**saves, "step_plain": plain, "step_behind": behind, "params": params}


class RankBench:
    """One trainer rank of the benchmark: its train step, its DCP saves against a raw write of its bytes, and
    steps taken while a save is written behind them."""

    def __init__(self, rank: int, world: int, model_dir: str) -> None:
        import torch

        from sc_app.rl.hf.logprobs import sequence_logprobs
        from sc_app.rl.hf.trainer import HFTrainer, TrainBatch, TrainerSettings

        self.rank, self.world = rank, world
        strategy = "fsdp" if world > 1 else "ddp"
        settings = TrainerSettings(model_dir, strategy=strategy, prompt_len=P)
        self.trainer = HFTrainer(settings, rank, world, torch.device("cpu"))
        g = torch.Generator().manual_seed(rank)
        tokens = torch.randint(4, self.trainer.hf_model.config.vocab_size, (16, P + R), generator=g)
        mask = torch.ones_like(tokens)
        with torch.no_grad():
            old = sequence_logprobs(self.trainer.model, tokens, mask, P)
        self.batch = TrainBatch(tokens, mask, torch.ones(16, R, dtype=torch.long), old, torch.randn(16, generator=g))
        self.version = 0

    def step(self) -> float:
        self.version += 1
        t0 = time.perf_counter()
        self.trainer.train_step(self.batch, self.version)
        return time.perf_counter() - t0

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.world > 1:
            dist.barrier(group=self.trainer.ckpt_group)

    def saves(self, work: Path, reps: int) -> dict[str, Any]:
        """DCP saves (the pause to capture, then the write) and raw writes of this rank's bytes, interleaved."""
        pattern = os.urandom(8 * MiB)
        paused, dcp_s, raw_s, my_bytes, total_bytes = [], [], [], [], []
        cpu: dict[str, list[float]] = {"paused": [], "dcp": [], "raw": [], "dcp_before": []}
        old = before_module("sc_app/rl/hf/policy_ckpt.py", ISSUE30_BEFORE)
        kinds = ("dcp", "raw", "dcp_before") if old is not None else ("dcp", "raw")
        for rep in range(reps):
            for kind in kinds if rep % 2 == 0 else tuple(reversed(kinds)):
                d = work / f"rep{rep}-{kind}"
                self.barrier()
                if kind == "dcp":
                    t0, c0 = time.perf_counter(), cpu_now()
                    self.trainer.capture()
                    paused.append(time.perf_counter() - t0)
                    cpu["paused"].append(cpu_now() - c0)
                    if self.rank == 0:
                        d.mkdir(parents=True)
                    self.barrier()
                    t0, c0 = time.perf_counter(), cpu_now()
                    written = self.trainer.write_captured(d)
                    dcp_s.append(time.perf_counter() - t0)
                    cpu["dcp"].append(cpu_now() - c0)
                    my_bytes.append(written.bytes)
                    self.barrier()
                    total_bytes.append(sum(p.stat().st_size for p in d.rglob("*") if p.is_file()))
                elif kind == "dcp_before":
                    self.trainer.capture()
                    if self.rank == 0:
                        d.mkdir(parents=True)
                    self.barrier()
                    c0 = cpu_now()
                    tr = self.trainer
                    _, captured = tr._captured  # type: ignore[misc]
                    old.write(captured, d, rank=tr.rank, process_group=tr.ckpt_group, model_files=tr.model_files)
                    cpu["dcp_before"].append(cpu_now() - c0)
                else:
                    nbytes = my_bytes[-1] if my_bytes else 0
                    d.mkdir(parents=True, exist_ok=True)
                    self.barrier()
                    c0 = cpu_now()
                    raw_s.append(raw_write(d / f"raw-{self.rank}", nbytes, pattern) if nbytes else float("nan"))
                    cpu["raw"].append(cpu_now() - c0 if nbytes else float("nan"))
                self.barrier()
                if self.rank == 0:
                    shutil.rmtree(d, ignore_errors=True)
        if raw_s and raw_s[0] != raw_s[0]:  # the first raw ran before the first DCP save had told its size
            raw_s, cpu["raw"] = raw_s[1:], cpu["raw"][1:]
        return {
            "paused": paused,
            "dcp_seconds": dcp_s,
            "raw_seconds": raw_s,
            "rank_bytes": my_bytes,
            "total_bytes": total_bytes,
            "cpu": cpu,
        }

    def steps_behind(self, d: Path, steps: int) -> tuple[list[float], list[float]]:
        """Steps with no save, then steps while a save is written behind them on another thread."""
        import torch
        import torch.distributed as dist

        plain = [self.step() for _ in range(steps)]
        behind: list[float] = []
        for _ in range(max(1, steps // 3)):
            self.trainer.capture()
            if self.rank == 0:
                d.mkdir(parents=True)
            self.barrier()
            t = threading.Thread(target=write_behind, args=(self.trainer, d))
            t.start()
            while True:  # every rank takes the same steps (they are collective): until every rank's write is done
                behind.append(self.step())
                alive = torch.tensor([float(t.is_alive())])
                if self.world > 1:
                    dist.all_reduce(alive)
                if alive.item() == 0:
                    break
            t.join()
            self.barrier()
            if self.rank == 0:
                shutil.rmtree(d)
        return plain, behind


def run_world(world: int, model_dir: Path, work: Path, reps: int, steps: int) -> list[dict[str, Any]]:
    from tests.support.hf import run_ranks

    work.mkdir(parents=True, exist_ok=True)
    return run_ranks(rank_main, world, str(model_dir), str(work), reps, steps, tmp=work)


def fold(world: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per repetition: the slowest rank's seconds; bytes of every rank together."""
    n = min(len(r["dcp_seconds"]) for r in ranks)
    m = min(len(r["raw_seconds"]) for r in ranks)
    total = ranks[0]["total_bytes"][0]
    written = sum(r["rank_bytes"][0] for r in ranks)
    if written != total:
        raise AssertionError(f"ranks report {written} bytes written, {total} on disk")
    dcp = [max(r["dcp_seconds"][i] for r in ranks) for i in range(n)]
    raw = [max(r["raw_seconds"][i] for r in ranks) for i in range(m)]
    paused = [max(r["paused"][i] for r in ranks) for i in range(n)]
    gib = total / 2**30
    cpu_dcp = [sum(r["cpu"]["dcp"][i] for r in ranks) / gib for i in range(n)]
    cpu_raw = [sum(r["cpu"]["raw"][i] for r in ranks) / gib for i in range(m)]
    per_100mib = [1000 * s / (total / (100 * MiB)) for s in paused]
    plain = [x for r in ranks for x in r["step_plain"]]
    behind = [x for r in ranks for x in r["step_behind"]]
    return {
        "world": world,
        "bytes": total,
        "per_rank_bytes": [r["rank_bytes"][0] for r in ranks],
        "dcp_mib_s": summary([total / MiB / s for s in dcp]),
        "raw_mib_s": summary([total / MiB / s for s in raw]),
        "paused_ms": summary([1000 * s for s in paused]),
        "paused_ms_per_100mib": summary(per_100mib),
        "cpu_s_per_gib_dcp": summary(cpu_dcp),
        "cpu_s_per_gib_raw": summary(cpu_raw),
        "cpu_s_per_gib_paused": summary([sum(r["cpu"]["paused"][i] for r in ranks) / gib for i in range(n)]),
        "cpu_dcp_over_raw": statistics.median(cpu_dcp) / statistics.median(cpu_raw),
        **_before(ranks, gib, cpu_raw),
        "step_plain_ms": summary([1000 * s for s in plain]),
        "step_behind_ms": summary([1000 * s for s in behind]) if behind else None,
    }


def _before(ranks: list[dict[str, Any]], gib: float, cpu_raw: list[float]) -> dict[str, Any]:
    """The pre-issue-30 save's CPU-seconds per GiB and its ratio to the raw write (absent without git history)."""
    k = min(len(r["cpu"].get("dcp_before", [])) for r in ranks)
    if not k:
        return {}
    before = [sum(r["cpu"]["dcp_before"][i] for r in ranks) / gib for i in range(k)]
    return {
        "cpu_s_per_gib_dcp_before": summary(before),
        "cpu_dcp_before_over_raw": statistics.median(before) / statistics.median(cpu_raw),
    }


def fmt(s: dict[str, float] | None, digits: int = 0) -> str:
    if s is None:
        return "—"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"Run: `bench/hf_policy_save.py{' --quick' if doc['quick'] else ''}` — {doc['host']['cpus']} CPUs, "
        f"Python {doc['host']['python']}, torch {doc['host']['torch']}, {doc['finished']}, {doc['wall_s']:.0f} s wall, "
        f"1-min load average {doc['host']['load_avg_1m'][0]} at the start, {doc['host']['load_avg_1m'][1]} at the end.",
        "Values: median (min-max) over repetitions. MiB/s of the policy files (weights + Adam state, fp32).",
        "",
        "| model | params | ranks | policy MiB | per-rank MiB | raw write MiB/s | DCP save MiB/s | xraw "
        "| training paused per save ms | step ms, no save | step ms, save behind | x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    cpu = [
        "",
        "CPU-seconds per GiB of policy files (all ranks' processes, getrusage) and the pause per 100 MiB of trainer",
        "state. Targets: DCP <= 1.5x raw; paused <= 10 ms per 100 MiB.",
        "",
        "| model | ranks | DCP save CPU-s/GiB | raw write CPU-s/GiB | **x raw** | before (issue 30) CPU-s/GiB "
        "| before x raw | capture CPU-s/GiB | **paused ms per 100 MiB** |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, entry in doc["results"].items():
        for r in entry["worlds"]:
            ratio = r["dcp_mib_s"]["median"] / r["raw_mib_s"]["median"]
            slow = (
                (r["step_behind_ms"]["median"] / r["step_plain_ms"]["median"]) if r["step_behind_ms"] else float("nan")
            )
            lines.append(
                f"| {size} | {entry['params'] / 1e6:.1f} M | {r['world']} | {r['bytes'] / MiB:.0f} | "
                f"{' + '.join(f'{b / MiB:.0f}' for b in r['per_rank_bytes'])} | {fmt(r['raw_mib_s'])} | "
                f"{fmt(r['dcp_mib_s'])} | {ratio:.2f} | {fmt(r['paused_ms'], 1)} | {fmt(r['step_plain_ms'])} | "
                f"{fmt(r['step_behind_ms'])} | {slow:.2f} |"
            )
            cpu.append(
                f"| {size} | {r['world']} | {fmt(r['cpu_s_per_gib_dcp'], 2)} | {fmt(r['cpu_s_per_gib_raw'], 2)} | "
                f"**{r['cpu_dcp_over_raw']:.2f}** | {fmt(r.get('cpu_s_per_gib_dcp_before'), 2)} | "
                f"{r.get('cpu_dcp_before_over_raw', float('nan')):.2f} | {fmt(r['cpu_s_per_gib_paused'], 2)} | "
                f"**{fmt(r['paused_ms_per_100mib'], 1)}** |"
            )
    return "\n".join(lines + cpu) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small model only, 2 repetitions")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temp dir)")
    args = ap.parse_args()
    import torch

    from sc_app.rl.hf.random_model import RandomModelSpec, write_random_model

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)  # the disk to measure on: a new directory there is fine
    work = Path(tempfile.mkdtemp(prefix="hf-bench-", dir=args.work))
    specs = QUICK_SPECS if args.quick else FULL_SPECS
    reps, steps = (2, 3) if args.quick else (7, 12)
    results: dict[str, Any] = {}
    try:
        for name, spec in specs.items():
            model_dir = write_random_model(work / f"model-{name}", RandomModelSpec(**spec, num_attention_heads=8,
                                                                                  num_key_value_heads=4))  # fmt: skip
            worlds = []
            params = 0
            for world in (1, 2):
                ranks = run_world(world, model_dir, work / f"{name}-w{world}", reps, steps)
                params = params or ranks[0]["params"]
                worlds.append(fold(world, ranks))
                print(json.dumps({"model": name, **worlds[-1]}), flush=True)
            results[name] = {"spec": spec, "params": params, "worlds": worlds}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc = {
        "quick": args.quick,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.perf_counter() - started,
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        },
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "hf_policy_save.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "hf_policy_save.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
