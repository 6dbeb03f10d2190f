"""Where a job's cold start goes: process start -> first training step of ``sc-app run``, phase by phase.

``.venv/bin/python bench/cold_start.py [--rounds 3] [--before REF]`` from the repo root.

Each start is the real CLI (``sc_app.cli.main``, embedded Ray, default config, empty checkpoint dir) in a fresh
process: this file with ``--child``, which marks the wall clock around the product's start-up pieces (wrapped in
place, behaviour unchanged) and, at the first step, records every process of the job (start time, CPU seconds) and
Ray's timeline of the actors' ``__init__``; the parent times the process from spawn to exit. Each kind of process's
imports are also timed alone in fresh interpreters (CPU seconds: the figure a loaded machine distorts least).
``--before REF`` runs the package as it was at git ``REF`` interleaved with the working tree (before, now, ...),
side by side in the tables. The load average around every start is recorded. Writes
``bench/results/cold_start.json`` (every run) and ``.md`` (the tables; ``--render JSON`` writes them again).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# (module, attribute path, phase name): wrapped in the child to mark when each piece of start-up begins and ends.
# Missing ones (another version of the package) are skipped.
PHASES = [
    ("sc_app.attempt.run", "init_ray", "ray_init"),
    ("transfer_queue", "init", "tq_init"),
    ("sc_app.attempt.setup", "TQPolicy.__init__", "workers_submitted"),
    ("sc_app.attempt.setup", "TQPolicy.trainers_ready", "trainers_ready"),
    ("sc_app.attempt.setup", "TQPolicy.generators_ready", "generators_ready"),
    ("sc_app.attempt.setup", "TQPolicy.sync_generation_weights", "weight_sync"),
    ("sc_app.attempt.run", "setup_single_controller", "setup"),  # where run.py holds it at module level
    ("sc_app.attempt.setup", "setup_single_controller", "setup"),  # where run.py takes it when it sets up
    ("sc_app.attempt.run", "drive", "drive"),
    ("sc_app.attempt.run", "run_job", "run_job"),
    ("sc_app.attempt.run", "shutdown_transferqueue", "tq_close"),  # where run.py holds it at module level
    ("sc_app.data_plane.transferqueue", "shutdown_transferqueue", "tq_close"),
    ("ray", "shutdown", "ray_shutdown"),
]
# what the driver imports before it does anything (the run command imports the rest lazily, when it needs it)
DRIVER_MODULES = ("sc_app.cli", "sc_app.attempt.run", "sc_app.observe.observer")
COLD = "COLD START: spawn -> first step began"
CPU = "CPU s of every process at the first step (driver + Ray + actors)"
# what each kind of process imports before its first piece of work (a Ray worker has imported ray already); each
# set is timed in a fresh interpreter: CPU seconds, the figure a loaded machine distorts least
IMPORTS = {
    "driver": [*DRIVER_MODULES, "sc_app.attempt.setup", "transfer_queue"],
    "trainer worker": ["ray", "sc_app.rl.trainer", "sc_app.rl.tiny_backend", "sc_app.data_plane.transferqueue"],
    "generation worker": ["ray", "sc_app.rl.generation", "sc_app.rl.tiny_backend"],
    "controller actor": ["ray", "sc_app.controller.actor", "transfer_queue"],
    "TQ controller / storage unit": ["ray", "transfer_queue"],
    "Ray worker (bare)": ["ray"],
}


class Marks:
    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.t.setdefault(name, time.time())  # the first time only: a phase re-entered later is not start-up

    def wrap(self, module: str, path: str, name: str) -> None:
        import importlib

        try:
            owner: Any = importlib.import_module(module)
        except ImportError:
            return
        *parents, attr = path.split(".")
        for p in parents:
            owner = getattr(owner, p, None)
        fn = getattr(owner, attr, None) if owner is not None else None
        if fn is None:
            return

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            self.mark(f"{name}.start")
            try:
                return fn(*a, **k)
            finally:
                self.mark(f"{name}.end")

        setattr(owner, attr, timed)


def job_processes() -> list[dict[str, Any]]:
    """Every process below this one (Ray's own, the workers): name, start time, CPU seconds so far."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = p.cmdline()
            names = [os.path.basename(c) for c in cmd[:3] if c.startswith("ray::") or c.endswith((".py", "_server"))]
            name = names[0] if names else os.path.basename(cmd[0]) if cmd else "?"
            cpu = p.cpu_times()
            out.append({"pid": p.pid, "name": name, "started": p.create_time(), "cpu_s": cpu.user + cpu.system})
    return out


def actor_inits() -> list[dict[str, Any]]:
    """Ray's timeline of every actor ``__init__`` so far: class, when it began, how long it ran."""
    import ray

    inits = []
    for e in ray.timeline():
        cat = str(e.get("cat", ""))
        if cat.startswith("task::") and cat.endswith(".__init__"):
            cls = cat[6:-9].rpartition(":")[2]  # a named actor's is "name:Class"
            inits.append({"cls": cls, "begin": e["ts"] / 1e6, "seconds": e["dur"] / 1e6})
    return inits


def child_imports(modules: list[str]) -> None:
    """Import ``modules`` in this fresh interpreter; print CPU and wall seconds and whether Dynamo was loaded."""
    import importlib
    import resource

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    for m in modules:
        importlib.import_module(m)
    wall, dynamo = time.perf_counter() - t0, "torch._dynamo" in sys.modules
    print(json.dumps({"cpu_s": cpu() - c0, "wall_s": wall, "dynamo": dynamo}))


def child(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--steps", type=int, default=1)
    args = p.parse_args(argv)
    marks = Marks()
    import importlib

    for m in DRIVER_MODULES:
        importlib.import_module(m)
    marks.mark("imported")
    for module, path, name in PHASES:
        marks.wrap(module, path, name)
    snapshot: dict[str, Any] = {}

    import psutil

    import sc_app.attempt.run as run_mod

    progress = run_mod.ClusterJob._progress

    def first_step(self: Any, record: Any) -> None:
        if type(record).__name__ == "StepRecord" and "first_step" not in marks.t:
            marks.mark("first_step")
            marks.t["first_step_began"] = marks.t["first_step"] - float(getattr(record, "step_seconds", 0.0) or 0.0)
            snapshot["processes"] = job_processes()
            own = psutil.Process().cpu_times()
            snapshot["driver_cpu_s"] = own.user + own.system
            snapshot["inits"] = actor_inits()
        progress(self, record)

    run_mod.ClusterJob._progress = first_step
    from sc_app.cli import main

    argv_run = ["run", "--checkpoint-dir", args.ckpt, "--max-steps", str(args.steps)]
    argv_run += ["--set", f"checkpoint.save_period={max(args.steps, 1)}"]
    with contextlib.redirect_stdout(sys.stderr):
        rc = main(argv_run)
    marks.mark("main_returned")
    Path(args.out).write_text(json.dumps({"rc": rc, "marks": marks.t, **snapshot}))


def extract(ref: str, into: Path) -> Path:
    """The package as it was at git ``ref``, under ``into`` (``into/sc_app``)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "sc_app"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def one_start(src: Path, work: Path, tag: str, steps: int) -> dict[str, Any]:
    out, ckpt = work / f"{tag}.json", work / f"{tag}.ckpt"
    env = {**os.environ, "PYTHONPATH": str(src)}
    load0 = os.getloadavg()[0]
    spawned = time.time()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out), "--ckpt", str(ckpt)]
    proc = subprocess.run([*cmd, "--steps", str(steps)], env=env, capture_output=True, text=True, timeout=900)
    exited = time.time()
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"{tag}: the cold start failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(out.read_text())
    res.update(spawned=spawned, exited=exited, load=[load0, os.getloadavg()[0]], tag=tag)
    shutil.rmtree(ckpt, ignore_errors=True)
    return res


def breakdown(res: dict[str, Any]) -> dict[str, float]:
    """Seconds of each start-up phase, in the order they happen on the driver (gaps named for what fills them)."""
    m, t0 = res["marks"], res["spawned"]

    def at(name: str) -> float | None:
        return m.get(name)

    rows: dict[str, float] = {}

    def span(label: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None:
            rows[label] = b - a

    span("python + driver imports", t0, at("imported"))
    span("config, input checks, lease", at("imported"), at("ray_init.start"))
    span("ray.init (embedded node)", at("ray_init.start"), at("ray_init.end"))
    span("ray up -> setup", at("ray_init.end"), at("setup.start"))
    setup_start = at("setup.start")
    span("setup: submit trainer/generation actors", at("workers_submitted.start"), at("workers_submitted.end"))
    span("setup: tq.init (TQ controller, then storage units)", at("tq_init.start"), at("tq_init.end"))
    span("setup: first weight sync (waits for the workers' setup)", at("weight_sync.start"), at("weight_sync.end"))
    span("setup: tq.init end -> setup end (seal, controller actor, sync)", at("tq_init.end"), at("setup.end"))
    span("setup (all)", setup_start, at("setup.end"))
    span("setup -> drive", at("setup.end"), at("drive.start"))
    span("drive -> first step began (first rollouts)", at("drive.start"), at("first_step_began"))
    span("first step", at("first_step_began"), at("first_step"))
    span(COLD, t0, at("first_step_began"))
    span("end: first step -> drive returned (the rest of the run, its last save)", at("first_step"), at("drive.end"))
    span("end: TransferQueue closed", at("tq_close.start"), at("tq_close.end"))
    span("end: ray.shutdown", at("ray_shutdown.start"), at("ray_shutdown.end"))
    span("end: run_job returned -> main returned (run log closed)", at("run_job.end"), at("main_returned"))
    span("end: main returned -> process exit", at("main_returned"), res["exited"])
    span("first step -> process exit", at("first_step"), res["exited"])
    span("process wall", t0, res["exited"])
    procs = res.get("processes")
    if not procs:  # no snapshot at a first step: no CPU figures
        return rows
    rows["CPU s: the driver"] = res.get("driver_cpu_s", float("nan"))
    rows["CPU s: Ray's own processes"] = sum(p["cpu_s"] for p in procs if not p["name"].startswith("ray::"))
    rows["CPU s: the job's actors"] = sum(p["cpu_s"] for p in procs if p["name"].startswith("ray::"))
    rows[CPU] = sum(p["cpu_s"] for p in procs) + res.get("driver_cpu_s", 0.0)
    rows["processes at the first step"] = float(len(procs))
    return rows


def actor_rows(res: dict[str, Any]) -> dict[str, float]:
    """Per actor class: process start -> __init__ end (start, imports, __init__), seconds after spawn."""
    t0 = res["spawned"]
    started: dict[str, float] = {}
    rows_cpu: dict[str, float] = {}
    for p in res.get("processes", []):
        if p["name"].startswith("ray::"):
            cls = p["name"][5:].split(".")[0].split(" ")[0]
            started.setdefault(cls, p["started"])
            rows_cpu[f"{cls}: CPU s"] = p["cpu_s"]
    rows = {}
    for i in res.get("inits", []):
        cls = i["cls"]
        s = started.get(cls)
        rows[f"{cls}: process started (after spawn)"] = (s - t0) if s else float("nan")
        rows[f"{cls}: __init__ ended (after spawn)"] = i["begin"] + i["seconds"] - t0
    return dict(sorted({**rows, **rows_cpu}.items()))


def cell(xs: list[float]) -> str:
    xs = [x for x in xs if x == x]
    one = f"{xs[0]:.2f}" if len(xs) == 1 else "—"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if len(xs) > 1 else one


def table(runs: dict[str, list[dict[str, Any]]], rows_of: Any, title: str) -> list[str]:
    tags = list(runs)
    per = {tag: [rows_of(r) for r in rs] for tag, rs in runs.items()}
    keys: list[str] = []
    for rs in per.values():
        for r in rs:
            keys += [k for k in r if k not in keys]
    head = f"| {title} | " + " | ".join(tags) + (" | x (now / before) |" if len(tags) == 2 else " |")
    lines = [head, "|---" * (len(tags) + 1 + (len(tags) == 2)) + "|"]
    for k in keys:
        vals = [[r[k] for r in per[tag] if k in r] for tag in tags]
        cells = [cell(v) for v in vals]
        ratio = ""
        if len(tags) == 2:
            a, b = (statistics.median(v) if v else None for v in vals)
            ratio = f" | {b / a:.2f}" if a and b is not None and a > 0 else " | —"
        lines.append(f"| {k} | " + " | ".join(cells) + ratio + " |")
    return lines


def one_import(src: Path, modules: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-imports", *modules]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tempfile.gettempdir())
    if proc.returncode != 0:
        raise RuntimeError(f"importing {modules} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def import_rows(res: dict[str, Any]) -> dict[str, float]:
    return {f"{k}: imports, CPU s": v["cpu_s"] for k, v in res.items()} | {
        f"{k}: imports torch._dynamo": float(v["dynamo"]) for k, v in res.items()
    }


def measure(variants: dict[str, Path], args: argparse.Namespace, work: Path) -> tuple[dict, dict]:
    """Interleaved: the import sets (``--import-rounds`` each), then the cold starts (``--rounds``)."""
    imports: dict[str, list[dict[str, Any]]] = {tag: [] for tag in variants}
    for _ in range(args.import_rounds):
        for tag, src in variants.items():
            imports[tag].append({kind: one_import(src, mods) for kind, mods in IMPORTS.items()})
    runs: dict[str, list[dict[str, Any]]] = {tag: [] for tag in variants}
    for i in range(args.rounds):
        for tag, src in variants.items():
            res = one_start(src, work, f"{tag}{i}", args.steps)
            runs[tag].append(res)
            b = breakdown(res)
            cold, cpu = b.get(COLD, float("nan")), b.get(CPU, float("nan"))
            load = f"{res['load'][0]:.1f}->{res['load'][1]:.1f}"
            print(f"{tag} #{i}: cold start {cold:.1f} s, CPU {cpu:.1f} s, load {load}", flush=True)
    return imports, runs


def parent(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="sc-cold-"))
    variants: dict[str, Path] = {}
    if args.before:
        variants["before"] = extract(args.before, work / "before")
    variants["now"] = REPO
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load0 = os.getloadavg()
    try:
        imports, runs = measure(variants, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started": started, "host": platform.node(), "cpus": os.cpu_count(), "load_start": load0}
    meta.update(load_end=os.getloadavg(), before=args.before, rounds=args.rounds, import_rounds=args.import_rounds)
    doc = {"meta": meta, "imports": imports, "runs": runs}
    (out / "cold_start.json").write_text(json.dumps(doc, indent=1))
    render(doc, out)


def render(doc: dict[str, Any], out: Path) -> None:
    """The tables of ``doc`` (``cold_start.json``) into ``out/cold_start.md``."""
    meta, imports, runs = doc["meta"], doc["imports"], doc["runs"]
    loads = [x for rs in runs.values() for r in rs for x in r["load"]]
    md = [
        f"# Cold start: spawn -> first step ({meta['started']}, {meta['cpus']} CPUs, load average "
        f"{min(loads):.1f}-{max(loads):.1f} during the starts)",
        "",
        f"Imports per process: CPU seconds in a fresh interpreter, median (min-max) of {meta['import_rounds']}.",
        "",
        *table(imports, import_rows, "process"),
        "",
        f"Cold starts: seconds, median (min-max) of {meta['rounds']}; every phase on the driver's wall clock.",
        "",
        *table(runs, breakdown, "phase"),
        "",
        "Actors: seconds after the driver process was spawned; CPU seconds at the first step.",
        "",
        *table(runs, actor_rows, "actor"),
        "",
    ]
    (out / "cold_start.md").write_text("\n".join(md))
    print("\n".join(md))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--render":  # the tables again from a cold_start.json
        path = Path(sys.argv[2])
        render(json.loads(path.read_text()), path.parent)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-imports":
        child_imports(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", help="git ref of the package to compare against, run interleaved")
    p.add_argument("--steps", type=int, default=1, help="max steps of each run (the first one is what counts)")
    p.add_argument("--import-rounds", type=int, default=3, help="fresh interpreters per import set and variant")
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    parent(p.parse_args())


if __name__ == "__main__":
    main()
