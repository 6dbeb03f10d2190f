"""What watching a run costs: steps/s of ``sc-app run`` with the run log, TensorBoard and metrics on vs off.

``.venv/bin/python bench/observe_overhead.py [--pairs 3] [--steps 120] [--quick]`` from the repo root.

Runs the real CLI (embedded Ray, the default config, checkpointing on as shipped), alternating off, on, off, on ...
so the drift of a shared machine hits both modes alike. "on" is the default (``metrics.jsonl`` + TensorBoard files
+ ``ray.util.metrics``); "off" is ``run.log_enabled=false run.metrics_enabled=false``. Each run's steps/s comes from
its trace file (``run.trace_file``, written the same way in both modes): train steps after the warm-up over the time
between the end of the warm-up and the last step. Each run starts from an empty checkpoint dir.

Writes ``bench/results/observe_overhead.json`` (every run) and ``.md`` (the side-by-side table). Timing on a loaded
machine is noise: the load average at start and end is recorded with the numbers.
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
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sc_app.observe.reader import read_history  # noqa: E402
from tests.support.proc import read_trace, sc_app  # noqa: E402

WARM = 2  # steps left out: worker start-up and first compilation land there
MODES = {
    "off": ["--set", "run.log_enabled=false", "--set", "run.metrics_enabled=false"],
    "on": [],
}


def steps_per_second(trace: list[dict[str, Any]], warm: int = WARM) -> tuple[float, float]:
    """(steps/s after the warm-up, median seconds between consecutive steps) of one run's trace."""
    t = [e["t"] for e in trace if e.get("ev") == "train"]
    if len(t) <= warm + 1:
        raise ValueError(f"a run needs more than {warm + 1} steps to be measured, it trained {len(t)}")
    gaps = [b - a for a, b in zip(t[warm - 1 :], t[warm:], strict=False)]
    return (len(t) - warm) / (t[-1] - t[warm - 1]), statistics.median(gaps)


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def one_run(work: Path, mode: str, index: int, steps: int) -> dict[str, Any]:
    ckpt, trace = work / f"{mode}{index}", work / f"{mode}{index}.trace"
    res = sc_app(
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        str(steps),
        "--set",
        f"run.trace_file={trace}",
        *MODES[mode],
        timeout=1800,
    )
    if res.rc != 0:
        raise SystemExit(f"{mode} run {index} failed (exit {res.rc}):\n{res.out[-3000:]}")
    rate, step_s = steps_per_second(read_trace(trace))
    logs = ckpt / "logs"
    if mode == "on":  # what was measured did log every step
        h = read_history(logs)
        logged = len({s.step for s in h.steps})
        lost = sum(int(e.data.get("steps", 0)) for e in h.events_named("dropped"))
        if logged != steps or lost:
            raise SystemExit(f"on run {index}: the run log holds {logged} of {steps} steps, {lost} dropped")
    elif logs.exists():
        raise SystemExit(f"off run {index} wrote a run log in {logs}: run.log_enabled=false was ignored")
    shutil.rmtree(ckpt, ignore_errors=True)
    return {"mode": mode, "steps_s": rate, "step_s": step_s}


def render(res: dict[str, Any]) -> str:
    on, off = res["on"]["steps_s"], res["off"]["steps_s"]
    lines = [
        "| mode | steps/s median (min-max) | runs | median s/step |",
        "|---|---|---|---|",
    ]
    for mode, what in (("off", "run log + metrics off"), ("on", "run log + TensorBoard + metrics on")):
        s = res[mode]["steps_s"]
        lines.append(
            f"| {mode}: {what} | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) | {s['n']} | "
            f"{res[mode]['step_s']['median']:.3f} |"
        )
    lines += [
        "",
        f"on/off: {on['median'] / off['median']:.3f} (overhead {100 * res['overhead']:+.1f}%); spread of the off "
        f"runs alone: {100 * res['noise']:.1f}% of their median; paired (on - off)/off per pair: "
        + ", ".join(f"{100 * d:+.1f}%" for d in res["paired"]),
        "",
        f"{res['machine']}, {res['steps']} steps per run, {WARM} warm-up steps left out; load average "
        f"{res['load_start']:.2f} at start, {res['load_end']:.2f} at end; {res['finished']}.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="off/on pairs (default 3)")
    ap.add_argument("--steps", type=int, default=120, help="train steps per run (default 120)")
    ap.add_argument("--quick", action="store_true", help="1 pair of 12 steps: checks the command, not the speed")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--work", type=Path, default=None, help="scratch checkpoint dirs (default: a temp dir)")
    args = ap.parse_args(argv)
    pairs, steps = (1, 12) if args.quick else (args.pairs, args.steps)
    if pairs < 1 or steps <= WARM + 1:
        ap.error(f"--pairs must be >= 1 and --steps > {WARM + 1}")
    load_start = os.getloadavg()[0]
    if load_start > 1.5:
        print(f"warning: load average {load_start:.2f}: timings on a busy machine are mostly noise", flush=True)
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)  # the disk to measure on: a new directory there is fine
    work = Path(tempfile.mkdtemp(prefix="sc-obs-bench-", dir=args.work))
    t0 = time.monotonic()
    runs: list[dict[str, Any]] = []
    try:
        for i in range(pairs):
            for mode in ("off", "on"):
                run = one_run(work, mode, i, steps)
                runs.append(run)
                print(f"[{mode} {i + 1}/{pairs}] {run['steps_s']:.2f} steps/s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {m: [r for r in runs if r["mode"] == m] for m in MODES}
    off_rates = [r["steps_s"] for r in by["off"]]
    res: dict[str, Any] = {
        "steps": steps,
        "pairs": pairs,
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": time.monotonic() - t0,
        "runs": runs,
        **{
            m: {"steps_s": summary([r["steps_s"] for r in by[m]]), "step_s": summary([r["step_s"] for r in by[m]])}
            for m in MODES
        },
    }
    res["overhead"] = 1 - res["on"]["steps_s"]["median"] / res["off"]["steps_s"]["median"]
    res["noise"] = (max(off_rates) - min(off_rates)) / statistics.median(off_rates)
    res["paired"] = [
        (on["steps_s"] - off["steps_s"]) / off["steps_s"] for off, on in zip(by["off"], by["on"], strict=True)
    ]
    table = render(res)
    print(table, end="")
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "observe_overhead.json").write_text(json.dumps(res, indent=2) + "\n")
        (args.out / "observe_overhead.md").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
