#!/usr/bin/env python3
"""Kill-anywhere stress: SIGKILL sc-app at explicit save phases and at random moments, then check the resume.

Usage (repo root):  .venv/bin/python bench/kill_stress.py --iterations 100 [--seed 1] [--dir DIR] [--remote]

Each iteration runs the real CLI (embedded Ray + TransferQueue) on one checkpoint directory and kills it either
at a fault-injection point (``SC_APP_FAULT_AT``: every phase of the save, controller SIGKILLed there) or at a
random time (the whole process session SIGKILLed). After each kill it checks:
  * preflight decides ``resume`` (or ``fresh`` before the first bundle) — never ``refuse``;
  * the bundle it picks is the newest ``step_N`` and every ``step_N`` left verifies (hashes, digests);
  * no ``tmp_step_*`` survives preflight (moved to quarantine/, not deleted);
and the next run's trace shows it resumed from that bundle with exactly the rows its sidecar index lists.
Prints one line per iteration and a final ``N passed, M failed`` line; exits 1 if any check failed.

By default the runs join one local Ray head started here (``ray start --head --block`` in its own session, killed
at the end — never ``ray stop``), which saves Ray's start-up per iteration; between iterations the harness waits
until the killed run's named actors (TransferQueue controller, restore guard) are gone, so every run starts on an
untouched TransferQueue. ``--embedded`` starts a fresh local Ray per run instead.

``--remote``: the same with ``checkpoint.remote`` on a real S3 server (radosgw started here), kills mid-upload
included, some runs on an empty directory resuming from the bucket (``bench/kill_stress_remote.py``); with
``--direct`` every bundle is committed on the bucket alone (``checkpoint.remote.parts=direct``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.tally import Tally  # noqa: E402
from sc_app.checkpoint import plan_resume, verify_bundle  # noqa: E402
from sc_app.data_plane.streamed_format import iter_groups  # noqa: E402
from sc_app.faults import SAVE_POINTS  # noqa: E402
from tests.support.proc import (  # noqa: E402
    free_port,
    kill_session,
    load_sidecar,
    read_trace,
    start_logged,
    step_bundles,
    wait_for,
)

GROUP_SIZE = 8


def steps(root: Path) -> list[int]:
    return sorted(step_bundles(root))


def start_head(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    import ray

    port = free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    with open(work / "ray-head.log", "wb") as log:
        head = subprocess.Popen(
            [
                str(ray_bin),
                "start",
                "--head",
                "--block",
                f"--port={port}",
                "--num-cpus=8",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"127.0.0.1:{port}"
    wait_for(lambda: "Ray runtime started" in (work / "ray-head.log").read_text(), 180, "the Ray head", head)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return head, address


def wait_until_run_is_gone() -> None:
    """The killed run's named actors (TQ controller, guard) must be gone before the next run starts."""
    import ray

    def gone() -> bool:
        names = ray.util.list_named_actors(all_namespaces=True)
        return not any(a["namespace"] in ("transfer_queue", "sc_app") for a in names)

    wait_for(gone, 120, "the previous run's actors to exit")


def one_iteration(
    i: int, rng: random.Random, root: Path, trace: Path, work: Path, address: str | None
) -> tuple[str, list[str]]:
    """Run, kill, check. Returns (what was done, problems found)."""
    before = steps(root)
    expected_start = before[-1] if before else 0
    n_starts = sum(1 for e in read_trace(trace) if e["ev"] == "start")
    what = run_and_kill(i, rng, root, trace, work, address, max_steps=expected_start + 6)
    problems = check_resumed(root, trace, n_starts, expected_start)
    left, found = check_after_preflight(root)
    return f"{what}; bundles {left}", problems + found


def run_and_kill(
    i: int, rng: random.Random, root: Path, trace: Path, work: Path, address: str | None, *, max_steps: int
) -> str:
    """One run killed at a fault point (70%) or by SIGKILL at a random moment; returns which."""
    use_fault = rng.random() < 0.7
    env = {}
    if use_fault:
        point = rng.choice(SAVE_POINTS)
        env = {"SC_APP_FAULT_AT": point, "SC_APP_FAULT_AFTER": str(rng.randint(0, 2))}
        what = f"fault {point} after {env['SC_APP_FAULT_AFTER']}"
    args = ["run", "--checkpoint-dir", str(root), "--max-steps", str(max_steps)]
    args += ["--set", "checkpoint.save_period=1", "--set", "checkpoint.keep=4", "--set", f"run.trace_file={trace}"]
    # the restart path: a controller killed at a save phase ends the process (no in-job restore)
    args += ["--set", "run.max_in_job_restores=0"]
    if address:
        args += ["--set", f"ray.address={address}"]
    proc = start_logged(*args, log=work / f"run{i}.log", env=env)
    try:
        if use_fault:
            proc.wait(timeout=300)
        else:
            delay = rng.uniform(12.0, 30.0)
            what = f"SIGKILL at {delay:.1f}s"
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay)
    finally:
        kill_session(proc.pid)
        if address:
            wait_until_run_is_gone()
    return what


def check_resumed(root: Path, trace: Path, n_starts: int, expected_start: int) -> list[str]:
    """The run just killed resumed from the bundle preflight chose last time, with exactly its rows."""
    problems: list[str] = []
    new_starts = [e for e in read_trace(trace) if e["ev"] == "start"][n_starts:]
    if new_starts:
        start = new_starts[0]
        if start["step"] != expected_start:
            problems.append(f"resumed from step {start['step']}, expected {expected_start}")
        elif expected_start:
            sidecar_path = root / f"step_{expected_start}" / "replay_buffer_metadata.pt"
            if sidecar_path.exists():  # may have been pruned since; then the check ran in an earlier iteration
                want = len(load_sidecar(sidecar_path)["groups"]) * GROUP_SIZE
                if start["restored_rows"] != want:
                    problems.append(f"restored {start['restored_rows']} rows, index lists {want}")
    return problems


def check_after_preflight(root: Path) -> tuple[list[int], list[str]]:
    """Preflight picks the newest bundle and leaves no tmp dir; every bundle verifies and holds its index's rows."""
    problems: list[str] = []
    plan = plan_resume(root)
    if plan.decision == "refuse":
        problems.append(f"preflight refused: {plan.reason}")
    left = steps(root)
    if left and plan.step != left[-1]:
        problems.append(f"preflight picked step {plan.step}, newest is {left[-1]}")
    if list(root.glob("tmp_step_*")):
        problems.append("tmp_step_* survived preflight")
    for s in left:
        report = verify_bundle(root / f"step_{s}")
        if not report.ok:
            problems.append(f"step_{s} does not verify: {report.problems[0]}")
            continue
        # the snapshot was written behind training: it must still hold exactly the rows its index lists
        sidecar = load_sidecar(root / f"step_{s}" / "replay_buffer_metadata.pt")
        listed = {sid for g in sidecar["groups"].values() for sid in g["sample_ids"]}
        stored = {sid for g in iter_groups(root / f"step_{s}" / "data_plane") for sid in g.ids}
        if stored != listed:
            problems.append(f"step_{s}: data plane holds {len(stored)} rows, its index lists {len(listed)}")
    return left, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a new temp dir)")
    ap.add_argument("--embedded", action="store_true", help="a fresh local Ray per run instead of one shared head")
    ap.add_argument("--remote", action="store_true", help="with checkpoint.remote on a real radosgw started here")
    ap.add_argument("--kills", default="fault,sigkill,mid-upload", help="--remote: the kinds of kill drawn from")
    ap.add_argument("--direct", action="store_true", help="--remote with checkpoint.remote.parts=direct: bundles "
                    "committed on the bucket alone (no local step_N/; resumes bring them home)")  # fmt: skip
    args = ap.parse_args()
    if args.remote:
        return main_remote(args)
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-kill-stress-"))
    work.mkdir(parents=True, exist_ok=True)
    root, trace = work / "ckpt", work / "trace.jsonl"
    rng = random.Random(args.seed)
    tally = Tally(args.iterations)
    head, address = (None, None) if args.embedded else start_head(work)
    try:
        for i in range(args.iterations):
            tally.record(i, *one_iteration(i, rng, root, trace, work, address))
    finally:
        if head is not None:
            kill_session(head.pid)
    return tally.close()


def main_remote(args: argparse.Namespace) -> int:
    from bench import kill_stress_remote as remote

    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-kill-stress-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    root, trace = work / "ckpt", work / "trace.jsonl"
    rng = random.Random(args.seed)
    tally = Tally(args.iterations + 1)
    bucket = remote.Bucket.start(work)
    bucket.allowed = tuple(k for k in remote.KINDS if k in args.kills.split(","))
    bucket.direct = args.direct
    head, address = (None, None)
    try:
        head, address = (None, None) if args.embedded else start_head(work)
        for i in range(args.iterations):
            tally.record(i, *remote.one_iteration(i, rng, root, trace, work, address, bucket))
        tally.record(args.iterations, "final run, not killed: the bucket catches up",
                     remote.final_catch_up(root, trace, work, address, bucket))  # fmt: skip
    finally:
        if head is not None:
            kill_session(head.pid)
        bucket.stop()
    summary = {"kills": bucket.kinds, "empty_dir_starts": bucket.fresh_zones,
               "kills_leaving_a_partial_upload": bucket.partial_uploads, "bucket_newest": bucket.newest}  # fmt: skip
    print(json.dumps(summary))
    return tally.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # the shared head uses ~/.ray/auth_token
    raise SystemExit(main())
