"""sc-app benchmarks: checkpoint and data-plane cost against the physical limit, side by side, in one run.

Run ``bench/run [--quick]`` from the repo root. One local Ray + one TransferQueue serve every section (re-started
with two storage units where a section compares unit counts); each section measures its candidates interleaved
(A, B, A, B, ...) so drift on a noisy machine hits all alike, and reports medians, ranges (min..max) and ratios.
Sections (``bench/scbench/``):

1-3. ``snapshot``: data-plane save and restore against their ceilings (raw disk, TransferQueue's own get/put),
     now vs before issue 12, 1 vs 2 storage units; bundle bytes after churn; the commit stall during a save
4-5. ``end_to_end``: where a train step's time goes (default config and the realistic 64x16 shape, now vs
     before), checkpointing on vs off, resume vs cold start
6.   ``throughput``: data-plane calls through the product vs TransferQueue's own client at several batch sizes
CPU  (issue 21) the CPU-seconds of every process (``cpu``) beside the wall-clock of sections 1-3, the cost of each
     stage alone (``stages``), the hf policy save against a raw write (``bench/hf_policy_save.py``, run as a
     subprocess) and the training time an hf run loses to checkpointing (``hf_run``); the last two full runs only

Writes ``<out>/latest.json``, ``<out>/latest.md`` and PNG plots beside them (``report``, ``plots``). ``--quick``
runs the smallest size only, with fewer repetitions; it still checks every result for correctness (row sets,
bytes, round trips, resume steps).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.scbench import end_to_end, hf_run, snapshot, throughput  # noqa: E402
from bench.scbench.common import BenchError, Harness, load_avg  # noqa: E402
from bench.scbench.plots import plot  # noqa: E402
from bench.scbench.report import evaluate_targets, render_markdown  # noqa: E402
from bench.scbench.stages import stage_costs  # noqa: E402

SECTIONS = ("stages", "data_plane", "put_get", "end_to_end", "hf_run", "policy_save")


def policy_save(quick: bool, work: Path) -> dict[str, Any]:
    """``bench/hf_policy_save.py`` (its own gloo rank processes) in a subprocess; its JSON document."""
    if quick:
        return {"skipped": "--quick: tests/e2e/test_hf_bench_quick.py runs bench/hf_policy_save.py --quick"}
    out = work / "policy_save"
    cmd = [sys.executable, str(REPO / "bench" / "hf_policy_save.py"), "--out", str(out), "--work", str(work)]
    print("[policy save] bench/hf_policy_save.py ...", flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, timeout=1800)
    return json.loads((out / "hf_policy_save.json").read_text())


def run_sections(h: Harness, args: argparse.Namespace, work: Path) -> list[str]:
    """Every section not skipped, in order, into ``h.results``; the failures (a section that fails keeps the
    others' results)."""
    sections = {
        "stages": lambda: stage_costs(work, 16 if args.quick else 256, 1 if args.quick else 5),
        "data_plane": lambda: snapshot.run(h, units=1) + snapshot.run(h, units=2),
        "put_get": lambda: throughput.run(h),
        "end_to_end": lambda: end_to_end.run(h),
        "hf_run": lambda: hf_run.run(h),
        "policy_save": lambda: policy_save(args.quick, work),
    }
    h.results["section_seconds"] = {}
    failed: list[str] = []
    for name, section in sections.items():
        if name in args.skip:
            continue
        t0 = time.perf_counter()
        try:
            h.results[name] = section()
        except (BenchError, subprocess.CalledProcessError) as exc:
            print(f"[{name}] FAILED: {exc}", flush=True)
            failed.append(f"{name}: {exc}")
        h.results["section_seconds"][name] = time.perf_counter() - t0
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smallest size only, fewer repetitions")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where latest.{json,md} go")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory for bundles (default: a temp dir)")
    ap.add_argument("--skip", action="append", default=[], choices=SECTIONS)
    ap.add_argument("--merge", action="store_true", help="keep sections of <out>/latest.json this run skips")
    ap.add_argument("--sizes", default=None, help="data-plane sizes in MiB, comma-separated (default: all)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="sc-app-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    h = Harness(args.out, work, args.quick)
    if args.sizes:
        h.sizes = [int(s) for s in args.sizes.split(",")]
        h.results["config"]["sizes_mib"] = h.sizes
    started = time.perf_counter()
    h.start()
    try:
        failed = run_sections(h, args, work)
    finally:
        h.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    res = h.results
    res["wall_s"] = time.perf_counter() - started
    res["load_avg_at_end"] = load_avg()
    previous = args.out / "latest.json"
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        for key in SECTIONS:
            if key not in res and key in old:
                res[key] = old[key]
        res["merged_from"] = old.get("finished_at")
    res["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["targets"] = evaluate_targets(res)
    res["plots"] = plot(res, args.out)
    md = render_markdown(res)
    (args.out / "latest.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (args.out / "latest.md").write_text(md + "\n")
    print(md)
    print(f"wrote {args.out / 'latest.json'}, {args.out / 'latest.md'}, plots: {', '.join(res['plots'])}")
    if failed:
        print("bench/run: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
