#!/usr/bin/env python3
"""Two clusters, one bucket: two real ``sc-app run`` processes, each with its own checkpoint directory (two clusters,
no shared volume), on one ``checkpoint.remote.url`` prefix of a real S3 server (radosgw, started here).

Usage (repo root):  .venv/bin/python bench/split_brain.py [--dir DIR]

Scenario *takeover* (a job moved to another cluster while the old one still runs): A trains and publishes; B starts
on an empty directory, resumes from the bucket, takes it (epoch + 1) and publishes; A goes on training and is then
stopped. Checked: every bundle A published is older than B's take-over, B's are all after it; B resumed from the
newest bundle A published (also one A published after B's first look, before its take-over); A says once that it
was fenced ("publishes nothing more there"); every listed bundle verifies on the bucket (every file's digest).
Scenario *simultaneous* (both started at once on a fresh prefix): when both read the empty prefix (two new
lineages), exactly one takes the bucket and the other is refused with one error line (exit 2) and publishes nothing;
when the second read the first's record, it adopts that lineage and takes the bucket over, as in *takeover*.
``--direct``: both runs with ``checkpoint.volume=local`` and ``checkpoint.remote.parts=direct`` (every bundle
committed on the bucket alone): then A, fenced, has nowhere left to save and stops with one line (exit 3,
superseded) instead of training on. Prints one line per check and a final ``N passed, M failed``; exits 1 if any
check failed. Not part of the test suite (two runs with embedded Ray each: minutes on a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sc_app.checkpoint.remote.bundles import check  # noqa: E402
from sc_app.checkpoint.remote.fence import read_record  # noqa: E402
from sc_app.checkpoint.remote.record import RemoteRecord  # noqa: E402
from sc_app.checkpoint.remote.store import Store  # noqa: E402
from sc_app.config.remote import RemoteConfig  # noqa: E402
from tests.support.proc import kill_session, run_args, sc_app, start_logged, wait_for  # noqa: E402
from tests.support.rgw import Rgw  # noqa: E402

DEADLINE = 900  # a guard against a hang: Ray starts take minutes at load 20+ on 2 cores
FENCED = "publishes nothing more there"
EMPTY = RemoteRecord("", "", 1, "")


class Checks:
    def __init__(self) -> None:
        self.failed = 0
        self.passed = 0

    def __call__(self, ok: bool, what: str) -> None:
        self.passed += ok
        self.failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}", flush=True)


DIRECT: list[str] = []  # --direct: the settings that commit every bundle on the bucket alone


def remote(rgw: Rgw, prefix: str) -> tuple[RemoteConfig, list[str]]:
    cfg = RemoteConfig(url=f"s3://{rgw.bucket}/{prefix}", endpoint=rgw.endpoint, region="us-east-1",
                       addressing_style="path", part_size_mib=5, request_timeout_s=10, drain_s=60)  # fmt: skip
    keys = ("url", "endpoint", "region", "addressing_style", "request_timeout_s", "drain_s")
    sets = [f"checkpoint.remote.{k}={getattr(cfg, k)}" for k in keys] + DIRECT
    return cfg, [a for kv in sets for a in ("--set", kv)]


def run_id(ckpt: Path) -> str:
    return str(json.loads((ckpt / "LEASE").read_text())["run_id"])


def all_verify(store: Store) -> bool:
    record, _ = read_record(store)
    return record is not None and all(
        check(store, e, lineage=record.lineage, hmac_key=None, digests=True).ok for e in record.bundles
    )


def stop(ckpt: Path, proc: object) -> None:
    sc_app("stop", "--checkpoint-dir", str(ckpt), "--wait", "300", timeout=400)


def takeover(rgw: Rgw, work: Path, ok: Checks) -> None:
    cfg, sets = remote(rgw, "takeover")
    sets += ["--set", "checkpoint.keep=50"]  # who published what is checked: nothing pruned
    store = Store(cfg)
    a_dir, b_dir, a_log, b_log = work / "a", work / "b", work / "a.log", work / "b.log"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(rgw.env())
    a = start_logged(*run_args(a_dir, work / "a.jsonl", 100_000, *sets), log=a_log, env=env)
    b = None
    try:
        wait_for(lambda: bool((read_record(store)[0] or EMPTY).bundles), DEADLINE, "a bundle published by A", a)
        b = start_logged(*run_args(b_dir, work / "b.jsonl", 100_000, *sets), log=b_log, env=env)

        def b_published() -> bool:
            record, _ = read_record(store)
            return record is not None and (b_dir / "LEASE").exists() and any(
                e.run_id == run_id(b_dir) for e in record.bundles)

        wait_for(b_published, DEADLINE, "a bundle published by B", b)
        if DIRECT:  # nowhere left to save: A stops at its next publish
            a_rc = a.wait(timeout=DEADLINE)
            ok(a_rc == 3, f"A, fenced, stopped as superseded (exit {a_rc}): it can save nowhere else")
        else:
            wait_for(lambda: FENCED in a_log.read_text(), DEADLINE, "A to notice it was fenced", a)
            time.sleep(10)  # A goes on training and saving locally: nothing of it may reach the bucket
            ok(a.poll() is None, "A still trains after B took the bucket (its own directory is still its own)")
            stop(a_dir, a)
            a_rc = a.wait(timeout=60)
        stop(b_dir, b)
        b_rc = b.wait(timeout=60)
    finally:
        kill_session(a.pid)
        if b is not None:
            kill_session(b.pid)
    a_out, b_out = a_log.read_text(), b_log.read_text()
    record, _ = read_record(store)
    assert record is not None
    a_id, b_id = run_id(a_dir), run_id(b_dir)
    ok((a_rc, b_rc) == (3 if DIRECT else 143, 143), f"both stopped as they should (exit {a_rc}, {b_rc})")
    ok("brought step_" in b_out and "resuming from" in b_out, "B resumed from the bucket into its empty directory")
    ok((record.run_id, record.epoch) == (b_id, 2) and (record.previous or {}).get("run_id") == a_id,
       f"the bucket is held by B (epoch {record.epoch}), A before it")
    by_a = [e for e in record.bundles if e.run_id == a_id]
    by_b = [e for e in record.bundles if e.run_id == b_id]
    ok(bool(by_a) and all(e.at <= record.acquired_at for e in by_a),
       f"A's {len(by_a)} bundles were all published before B took the bucket ({record.acquired_at})")
    ok(bool(by_b) and all(e.at >= record.acquired_at for e in by_b) and len(by_a) + len(by_b) == len(record.bundles),
       f"B's {len(by_b)} bundles after it; no other publisher")
    check_fenced(ok, a_out)
    resumed = re.search(r"resuming from \S+ \(step (\d+)\)", b_out)
    ok(resumed is not None and int(resumed.group(1)) == max(e.step for e in by_a),
       f"B resumed from the newest bundle A published (step {resumed.group(1) if resumed else None}; A's newest "
       f"{max(e.step for e in by_a)}): what A published after B's first look came home before B decided")
    ok(all_verify(store), f"every one of the {len(record.bundles)} listed bundles verifies on the bucket")


def check_fenced(ok: Checks, a_out: str) -> None:
    """A said once that it was fenced; then it trained on locally, or (``--direct``) that was its one error line."""
    fenced = [ln for ln in a_out.splitlines() if FENCED in ln]
    after = a_out[a_out.index(FENCED):] if fenced else ""
    # (an "uploaded step_N" line may still follow it: a publish from before the take-over, reported at the next step)
    ok(len(fenced) == 1, f"A said it was fenced in one line: {fenced[:1]}")
    a_saved = sum(1 for ln in after.splitlines() if "saved step_" in ln)
    if DIRECT:
        ok("Traceback" not in a_out and fenced[:1] == [ln for ln in a_out.splitlines() if "error:" in ln],
           "A's fenced line is its one error line, no traceback")
    else:
        ok(a_saved > 0, f"A saved {a_saved} bundles locally after it was fenced, none reached the bucket")


def simultaneous(rgw: Rgw, work: Path, ok: Checks) -> None:
    cfg, sets = remote(rgw, "simultaneous")
    store = Store(cfg)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(rgw.env())
    procs = {n: start_logged(*run_args(work / n, work / f"{n}.jsonl", 6, *sets), log=work / f"{n}.log", env=env)
             for n in ("a", "b")}  # fmt: skip
    try:
        rcs = {n: p.wait(timeout=DEADLINE) for n, p in procs.items()}
    finally:
        for p in procs.values():
            kill_session(p.pid)
    record, _ = read_record(store)
    assert record is not None
    logs = {n: (work / f"{n}.log").read_text() for n in procs}
    losers = [n for n, rc in rcs.items() if rc == 2]
    if losers:  # both read an empty prefix: two new lineages, the second compare-and-swap is refused
        (loser,) = losers
        (winner,) = set(procs) - {loser}
        errors = [ln for ln in logs[loser].splitlines() if "error:" in ln]
        ok(rcs[winner] == 0, f"one run finished, the other was refused ({rcs})")
        ok(len(errors) == 1 and "Traceback" not in logs[loser], f"the refused run said why in one line: {errors}")
        ok({e.run_id for e in record.bundles} == {run_id(work / winner)}, "only the winner published")
    else:  # the second read the first's record: it adopted its lineage and took the bucket over
        first = next(n for n in procs if run_id(work / n) == (record.previous or {}).get("run_id"))
        # (--direct: the first, fenced before its last publish, stops as superseded: it can save nowhere else)
        allowed = {0, 3} if DIRECT else {0}
        ok(rcs[first] in allowed and rcs[next(n for n in procs if n != first)] == 0,
           f"both ended as they should ({rcs}); the later took the bucket over")
        by_first = [e for e in record.bundles if e.run_id == run_id(work / first)]
        ok(all(e.at <= record.acquired_at for e in by_first), "the first published nothing after the take-over")
        ok(logs[first].count(FENCED) <= 1, "the fenced run said so at most once")
    ok(all_verify(store), "every listed bundle verifies on the bucket")


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="work dir (default: a new temp dir)")
    ap.add_argument("--direct", action="store_true", help="checkpoint.remote.parts=direct for both runs")
    args = ap.parse_args()
    if args.direct:
        DIRECT.extend(["checkpoint.volume=local", "checkpoint.remote.parts=direct", "data_plane.snapshot=streamed"])
    work = args.dir or Path(tempfile.mkdtemp(prefix="sc-app-split-brain-"))
    work.mkdir(parents=True, exist_ok=True)
    rgw = Rgw(work / "rgw").start()
    os.environ.update(rgw.env())
    ok = Checks()
    t0 = time.monotonic()
    try:
        takeover(rgw, work / "takeover", ok)
        simultaneous(rgw, work / "simultaneous", ok)
    finally:
        rgw.stop()
    print(json.dumps({"passed": ok.passed, "failed": ok.failed, "seconds": round(time.monotonic() - t0)}))
    print(f"{ok.passed} passed, {ok.failed} failed")
    return 1 if ok.failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
