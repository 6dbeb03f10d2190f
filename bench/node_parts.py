"""Parts of a bundle on a node's own disk (``checkpoint.volume: local``, issue 28 part 2): what the controller's
gather of a trainer rank's staged part and the driver's send of a bundle's ``policy/`` cost, against a plain copy
of the same bytes on the same disk, side by side in one run.

Run from the repo root: ``.venv/bin/python bench/node_parts.py [--mib N] [--reps R] [--out DIR] [--work DIR]``.

One local Ray (2 CPUs). A "rank" actor exposes the trainer worker's two calls with the same library code
(``read_part`` → ``node_parts.read_chunk``, ``receive_policy`` → ``node_parts.write_at``); the measured code is the
real ``sc_app.controller.gather.gather_policy`` (in this process, its blocking writes on a thread, as the
controller's save thread runs them) and ``sc_app.attempt.node_copies.send_policy``. Per repetition, interleaved:

* copy: the part's files copied to a fresh directory, hashed (BLAKE3) as read, each fsynced — the least that moving
  the bytes to another file and checking them costs;
* gather<N>: the staged part (a ``PolicyPart`` with the writer's records) gathered into a fresh ``policy/``: chunks
  through Ray's object store (N read ahead, ``gather.AHEAD``), hashed as written, fsynced, checked against the
  writer's records;
* send: the same files sent to the actor (one ``ray.put`` per chunk, 4 in flight), written there at their offsets,
  then checked there against the manifest's digests (``node_parts.check_copy``, before the node's ranks load it).

Everything runs on one machine: Ray moves the chunks through shared memory, not a network, so the figures are
the software's cost, not a cluster's bandwidth (a real head receives at its NIC's rate). Writes
``<out>/node_parts.json`` and ``<out>/node_parts.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import ray  # noqa: E402

from sc_app.attempt.node_copies import send_policy  # noqa: E402
from sc_app.checkpoint import node_parts  # noqa: E402
from sc_app.checkpoint.node_parts import PolicyPart  # noqa: E402
from sc_app.controller import gather as gather_module  # noqa: E402
from sc_app.controller.gather import gather_policy  # noqa: E402
from sc_app.io import hashing  # noqa: E402

MiB = 1024 * 1024


@ray.remote(num_cpus=0)
class Rank:
    """The trainer worker's two calls, by the same library code, on a part staged under ``root``."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def read_part(self, rel: str, offset: int) -> bytes:
        return node_parts.read_chunk(self.root / "save", rel, offset)

    def drop_part(self) -> None:
        pass  # kept: the next repetition gathers it again

    def receive_policy(self, bundle: str, rel: str, offset: int, data: bytes, first: bool = False) -> None:
        node_parts.receive(self.root, bundle, rel, offset, data, first)

    def check_received(self, bundle: str, expected: dict[str, str]) -> None:
        node_parts.check_copy(node_parts.restore_dir(self.root) / bundle, expected)  # before the node's ranks load


def stage(directory: Path, mib: int) -> PolicyPart:
    """A part like a rank's: one large shard and a small one, with the writer's records."""
    directory.mkdir(parents=True)
    files = {}
    for name, size in (("__1_0.distcp", mib * MiB - 4096), ("__1_1.distcp", 4096)):
        data = os.urandom(size)
        (directory / name).write_bytes(data)
        files[name] = hashing.FileDigest(hashing.BLAKE3, hashing.digest_bytes(data, hashing.BLAKE3), size)
    return PolicyPart(files, "bench", node_parts.list_files(directory))


def copy(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for name in node_parts.list_files(src):
        with open(src / name, "rb") as fin, open(dst / name, "wb") as fout:
            writer = hashing.HashingWriter(fout.raw)  # type: ignore[attr-defined]
            shutil.copyfileobj(fin, writer, 8 * MiB)
            os.fsync(fout.fileno())


def gather(rank: Any, part: PolicyPart, dst: Path, pool: ThreadPoolExecutor) -> None:
    dst.mkdir(parents=True)

    async def in_background(fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    got = asyncio.run(gather_policy([rank], [part], dst, in_background))
    assert got == part.files, "the gather returns the writer's records"


def measure(work: Path, mib: int, reps: int, aheads: list[int]) -> dict[str, list[float]]:
    """Seconds of each path per repetition, interleaved (forward, then backward)."""
    part = stage(work / "rank" / "save", mib)
    policy = work / "bundle" / "step_1" / "policy"
    shutil.copytree(work / "rank" / "save", policy)
    expected = {rel: hashing.label(r.alg, r.digest) for rel, r in part.files.items()}
    rank = Rank.remote(str(work / "rank"))
    ray.get(rank.drop_part.remote())
    pool = ThreadPoolExecutor(1)
    paths = ["copy", *[f"gather{n}" for n in aheads], "send"]
    seconds: dict[str, list[float]] = {what: [] for what in paths}
    for rep in range(reps):
        for what in paths if rep % 2 == 0 else paths[::-1]:
            dst = work / f"{what}-{rep}"
            t0 = time.perf_counter()
            if what == "copy":
                copy(work / "rank" / "save", dst)
            elif what.startswith("gather"):
                gather_module.AHEAD = int(what.removeprefix("gather"))
                gather(rank, part, dst, pool)
            else:
                send_policy([rank], policy, ray.get)
                ray.get(rank.check_received.remote("step_1", expected))
            seconds[what].append(time.perf_counter() - t0)
            shutil.rmtree(dst, ignore_errors=True)
    sent = node_parts.restore_dir(work / "rank") / "step_1"
    assert node_parts.list_files(sent) == node_parts.list_files(policy), "the send delivers every file"
    return seconds


def report(seconds: dict[str, list[float]], mib: int, reps: int, out: Path) -> None:
    med = {k: statistics.median(v) for k, v in seconds.items()}
    result = {
        "mib": mib,
        "reps": reps,
        "seconds": seconds,
        "median_s": med,
        "mib_per_s": {k: mib / v for k, v in med.items()},
        "ratio_to_copy": {k: med[k] / med["copy"] for k in med if k != "copy"},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "node_parts.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Parts on a node's own disk: {mib} MiB, {reps} repetitions ({result['when']} UTC, "
        f"1-min load at the end {result['machine']['load'][0]:.1f})",
        "",
        "| path | median s | MiB/s | x copy |",
        "|---|---|---|---|",
    ]
    for k in med:
        ratio = "1.00" if k == "copy" else f"{result['ratio_to_copy'][k]:.2f}"
        lines.append(f"| {k} | {med[k]:.3f} | {result['mib_per_s'][k]:.0f} | {ratio} |")
    (out / "node_parts.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="size of the staged part (MiB)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--ahead", default=str(gather_module.AHEAD), help="gather's chunks in flight, e.g. 1,3 (each)")
    args = ap.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)  # the disk to measure on: a new directory there is fine
    work = Path(tempfile.mkdtemp(prefix="node-parts-", dir=args.work))
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        seconds = measure(work, args.mib, args.reps, [int(n) for n in args.ahead.split(",")])
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    report(seconds, args.mib, args.reps, args.out)


if __name__ == "__main__":
    main()
