#!/usr/bin/env python3
"""Issue 28's two run-level targets of the remote tier, measured side by side in one run against a real S3 server
(Ceph's radosgw, started here as the suite starts it):

1. **Resume from the bucket into an empty directory <= (raw download + the local resume) x 1.1.** One bundle padded
   to ``--mib`` of data plane (``bench/scbench/padded_bundle.py``) is published on a fresh prefix. Per round, in
   turn: ``sc-app run`` on an empty directory (it brings the bundle home, verifies it, resumes); the same run on a
   directory holding that bundle (the local resume, with the same remote tier configured: it only looks); and
   boto3's raw ``get_object`` of every object of the bundle into files, fsynced. Each run is measured from its
   process start to its first trained step (the trace's first ``train`` event), then SIGKILLed (no save, so the
   bucket stays as it was). Medians over ``--rounds``.
2. **Training time lost to uploads <= 1 % of a realistic step.** Pairs of runs in the realistic shape of
   ``bench/sc_bench.py`` (64 prompts x 16 generations per step, 1,024 rows of 224 + 16 tokens; ``--shape default``:
   the tiny default config, 64 rows and ~80 ms per step) with a bundle every ``--save-period`` steps, with and
   without the remote tier (every bundle uploaded behind training by the driver's uploader thread), the order
   alternating: the training seconds of each run (the trace's ``train`` events, from the third step to the last)
   compared. The S3 server shares this machine's 2 cores, so its work counts against training too.

Usage (repo root; root for radosgw):  .venv/bin/python bench/remote_targets.py [--mib 256] [--rounds 3] [--pairs 3]
Writes ``bench/results/remote_targets.json``; prints the verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scbench.common import MiB, load_avg  # noqa: E402
from bench.scbench.padded_bundle import pad_bundle  # noqa: E402
from tests.support.proc import kill_session, read_trace, sc_app, start_logged, wait_for  # noqa: E402
from tests.support.rgw import Rgw  # noqa: E402

RESULTS = REPO / "bench" / "results" / "remote_targets.json"


def remote_sets(rgw: Rgw, prefix: str) -> list[str]:
    kv = [f"checkpoint.remote.url=s3://{rgw.bucket}/{prefix}", f"checkpoint.remote.endpoint={rgw.endpoint}",
          "checkpoint.remote.region=us-east-1", "checkpoint.remote.addressing_style=path"]  # fmt: skip
    return [a for x in kv for a in ("--set", x)]


def run_args(ckpt: Path, trace: Path, max_steps: int, *extra: str) -> list[str]:
    return ["run", "--checkpoint-dir", str(ckpt), "--max-steps", str(max_steps), "--set", f"run.trace_file={trace}",
            *extra]  # fmt: skip


def to_first_step(args: list[str], trace: Path, log: Path, env: dict[str, str]) -> float:
    """Seconds from the process start to its first trained step; then the run is SIGKILLed."""
    trace.unlink(missing_ok=True)
    t0 = time.time()
    proc = start_logged(*args, log=log, env=env)
    try:
        trained = lambda: any(e["ev"] == "train" for e in read_trace(trace))  # noqa: E731
        wait_for(trained, 600, "the first trained step", proc, log=log)
        first = min(e["t"] for e in read_trace(trace) if e["ev"] == "train")
    finally:
        kill_session(proc.pid)
    return first - t0


def raw_download(rgw: Rgw, prefix: str, into: Path) -> float:
    """boto3's get_object of every object under ``prefix``, streamed into files and fsynced."""
    client = rgw.client()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=rgw.bucket, Prefix=prefix)
            for o in page.get("Contents", [])]  # fmt: skip
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    t0 = time.perf_counter()
    for n, key in enumerate(keys):
        body = client.get_object(Bucket=rgw.bucket, Key=key)["Body"]
        fd = os.open(into / f"{n}.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for chunk in body.iter_chunks(1 << 20):
                os.write(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def publish_padded(rgw: Rgw, work: Path, mib: int) -> tuple[str, Path, int]:
    """A tiny model's bundle, its data plane padded to ``mib``, published alone on a fresh prefix; returns the
    prefix, a directory holding it (and the lineage) for the local resume, and its step."""
    from sc_app.checkpoint import layout
    from sc_app.checkpoint.lineage import LINEAGE_FILE, read_lineage
    from sc_app.checkpoint.remote.fence import acquire
    from sc_app.checkpoint.remote.probe import open_bucket
    from sc_app.checkpoint.remote.upload import upload_bundle
    from sc_app.config.remote import RemoteConfig

    src = work / "source"
    done = sc_app(*run_args(src, work / "source.jsonl", 4, "--set", "checkpoint.save_period=4"), timeout=600)
    assert done.rc == 0, done.out[-2000:]
    local = work / "local"
    local.mkdir()
    shutil.copy2(src / LINEAGE_FILE, local / LINEAGE_FILE)
    pad_bundle(src, local, mib * MiB)
    step = layout.step_dirs(local)[0][0]
    prefix = f"targets-{os.getpid()}"
    os.environ.update(rgw.env())
    cfg = RemoteConfig(url=f"s3://{rgw.bucket}/{prefix}", endpoint=rgw.endpoint, region="us-east-1",
                       addressing_style="path", part_size_mib=64)  # fmt: skip
    lineage = read_lineage(local)
    assert lineage is not None
    store, _ = open_bucket(cfg, lineage=lineage)
    result = upload_bundle(store, local / layout.step_name(step), acquire(store, "bench", lineage), hmac_key=None,
                           deadline_s=1800)  # fmt: skip
    assert result.published
    return prefix, local, step


def resume_target(rgw: Rgw, work: Path, mib: int, rounds: int) -> dict[str, Any]:
    prefix, local, step = publish_padded(rgw, work, mib)
    env = rgw.env()
    steps = str(step + 50)
    out: dict[str, list[float]] = {"remote_resume_s": [], "local_resume_s": [], "raw_download_s": []}
    load: list[float] = []
    for r in range(rounds):
        empty = work / f"empty{r}"
        args = run_args(empty, work / "t.jsonl", int(steps), *remote_sets(rgw, prefix))
        out["remote_resume_s"].append(to_first_step(args, work / "t.jsonl", work / f"remote{r}.log", env))
        shutil.rmtree(empty, ignore_errors=True)
        copy = work / f"copy{r}"
        shutil.copytree(local, copy)
        args = run_args(copy, work / "t.jsonl", int(steps), *remote_sets(rgw, prefix))
        out["local_resume_s"].append(to_first_step(args, work / "t.jsonl", work / f"local{r}.log", env))
        shutil.rmtree(copy, ignore_errors=True)
        out["raw_download_s"].append(raw_download(rgw, f"{prefix}/bundles/", work / "raw"))
        load.append(load_avg())
        print(f"[resume] round {r + 1}: remote {out['remote_resume_s'][-1]:.2f}s, local "
              f"{out['local_resume_s'][-1]:.2f}s, raw download {out['raw_download_s'][-1]:.2f}s", flush=True)
    med = {k: statistics.median(v) for k, v in out.items()}
    budget = (med["raw_download_s"] + med["local_resume_s"]) * 1.1
    return {"data_plane_mib": mib, "rounds": out, "median": med, "budget_s": budget, "load_avg": load,
            "ratio": med["remote_resume_s"] / (med["raw_download_s"] + med["local_resume_s"]),
            "met": med["remote_resume_s"] <= budget}  # fmt: skip


def server_cpu_s(rgw: Rgw) -> float:
    """CPU seconds the S3 server's daemons (monitor, OSD, radosgw) have used so far."""
    total = 0.0
    for pid in rgw.pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def training_seconds(trace: Path) -> float:
    """From the run's third trained step to its last (its start-up and first steps left out)."""
    t = sorted(e["t"] for e in read_trace(trace) if e["ev"] == "train")
    return t[-1] - t[2]


def shape_sets(shape: str) -> list[str]:
    """``--set`` arguments of the step shape (``realistic``: ``bench.scbench.end_to_end.REALISTIC``)."""
    if shape == "default":
        return []
    from bench.scbench.end_to_end import REALISTIC

    kv = [f"{section}.{k}={v}" for section, values in REALISTIC.items() for k, v in values.items()]
    return [a for x in kv for a in ("--set", x)]


def upload_cost(rgw: Rgw, work: Path, pairs: int, steps: int, period: int, shape: str) -> dict[str, Any]:
    """Pairs of runs, with and without the remote tier (order alternating), a bundle every ``period`` steps; the
    time lost is the median over pairs of (training seconds with - without) / without."""
    env = rgw.env()
    seconds: dict[str, list[float]] = {"off": [], "on": []}
    server: dict[str, list[float]] = {"off": [], "on": []}  # the S3 server's CPU-s during each run
    uploads: list[int] = []
    for p in range(pairs):
        for mode in ("off", "on") if p % 2 == 0 else ("on", "off"):
            ckpt, trace = work / f"steps-{mode}{p}", work / f"steps-{mode}{p}.jsonl"
            extra = ["--set", f"checkpoint.save_period={period}", "--set", "checkpoint.keep=2", *shape_sets(shape)]
            if mode == "on":
                extra += remote_sets(rgw, f"steps-{os.getpid()}-{p}")
            cpu0 = server_cpu_s(rgw)
            done = sc_app(*run_args(ckpt, trace, steps, *extra), timeout=900, env=env)
            server[mode].append(server_cpu_s(rgw) - cpu0)
            assert done.rc == 0, done.out[-2000:]
            if mode == "on":
                uploads.append(done.out.count("uploaded step_"))
            seconds[mode].append(training_seconds(trace))
            shutil.rmtree(ckpt, ignore_errors=True)
            print(f"[uploads] pair {p + 1} {mode}: {seconds[mode][-1]:.2f}s of training, the S3 server used "
                  f"{server[mode][-1]:.2f} CPU-s", flush=True)
    lost = [(on - off) / off for on, off in zip(seconds["on"], seconds["off"], strict=True)]
    return {"shape": shape, "steps": steps, "save_period": period, "pairs": pairs, "training_s": seconds,
            "server_cpu_s": server,
            "uploads_per_run": uploads, "mean_step_s": statistics.median(seconds["off"]) / (steps - 3),
            "lost_fraction_per_pair": lost, "lost_fraction": statistics.median(lost),
            "met": statistics.median(lost) <= 0.01}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--save-period", type=int, default=4)
    ap.add_argument("--shape", choices=("realistic", "default"), default="realistic")
    ap.add_argument("--skip-resume", action="store_true", help="measure the uploads' cost only")
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-remote-targets-"))
    work.mkdir(parents=True, exist_ok=True)
    rgw = Rgw(work / "rgw").start()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_start": load_avg()}
    try:
        if not args.skip_resume:
            results["resume"] = resume_target(rgw, work, args.mib, args.rounds)
        results["uploads"] = upload_cost(rgw, work, args.pairs, args.steps, args.save_period, args.shape)
    finally:
        rgw.stop()
    results["load_avg_end"] = load_avg()
    out = RESULTS if not args.skip_resume else RESULTS.with_name(f"remote_targets_uploads_{args.shape}.json")
    out.write_text(json.dumps(results, indent=1))
    if "resume" in results:
        r = results["resume"]
        print(f"resume from the bucket: {r['median']['remote_resume_s']:.2f}s vs (raw download "
              f"{r['median']['raw_download_s']:.2f}s + local resume {r['median']['local_resume_s']:.2f}s) = "
              f"{r['ratio']:.2f}x (target <= 1.1x): {'met' if r['met'] else 'missed'}")
    u = results["uploads"]
    print(f"training time lost to uploads ({u['shape']} shape, a step {u['mean_step_s']:.2f}s): "
          f"{u['lost_fraction'] * 100:+.2f}% (target <= 1%): {'met' if u['met'] else 'missed'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
