"""The remote-tier mode of ``bench/kill_stress.py`` (``--remote``): the same kills with ``checkpoint.remote`` set to a
real S3 server (Ceph's radosgw, ``tests/support/rgw.py``, started in the work dir and stopped by PID at the end).

Each iteration kills the run in one of three ways: at a save phase (``SC_APP_FAULT_AT``), by SIGKILL of the whole
run at a random moment 0-10 s after its first bundle (during a save, an upload, retention), or **mid-upload**:
radosgw is paused (SIGSTOP) so that the upload in flight stalls, the run is SIGKILLed, and radosgw goes on
(SIGCONT). Some iterations start on an empty checkpoint directory (a new zone, an emptyDir): the run must resume
from the bucket.

After every kill it checks, besides the local checks of ``kill_stress.py``:
  * the run resumed from max(newest local bundle, newest bundle on the bucket that counts), with its sidecar's rows;
  * every bundle the bucket's record lists verifies there (every file's digest read back): a kill never publishes a
    partial bundle;
  * nothing published is lost: the bucket's newest counting step never goes back;
and at the end one run that is not killed catches the bucket up: the bucket's newest bundle is then the local
newest, and it comes home into an empty directory and verifies.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import kill_stress as ks
from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.remote.bundles import check
from sc_app.checkpoint.remote.fence import BUNDLES, read_record
from sc_app.checkpoint.remote.store import Store
from sc_app.checkpoint.remote.sync import bring_newer, newest_counting
from sc_app.config.remote import RemoteConfig
from sc_app.faults import BUCKET_SAVE_POINTS, SAVE_POINTS
from tests.support.proc import kill_session, read_trace, start_logged, wait_for
from tests.support.rgw import Rgw

KINDS = ("fault", "sigkill", "mid-upload")
WEIGHTS = {"fault": 4, "sigkill": 3, "mid-upload": 3}


@dataclass
class Bucket:
    rgw: Any
    cfg: RemoteConfig
    store: Store
    newest: int = 0  # the newest counting step seen on the bucket so far (never goes back)
    kinds: dict[str, int] = field(default_factory=dict)
    partial_uploads: int = 0  # kills that left an upload no record lists (caught mid-upload)
    fresh_zones: int = 0
    allowed: tuple[str, ...] = KINDS  # the kinds of kill drawn from (``--kills``)
    direct: bool = False  # ``--direct``: checkpoint.remote.parts=direct, every bundle committed on the bucket alone

    @classmethod
    def start(cls, work: Path) -> Bucket:
        rgw = Rgw(work / "rgw").start()
        cfg = RemoteConfig(url=f"s3://{rgw.bucket}/kill-stress", endpoint=rgw.endpoint, region="us-east-1",
                           addressing_style="path", part_size_mib=5, request_timeout_s=10, bundle_deadline_s=120,
                           drain_s=60)  # fmt: skip
        os.environ.update(rgw.env())  # this process reads the bucket too
        return cls(rgw, cfg, Store(cfg))

    def sets(self) -> list[str]:
        keys = ("url", "endpoint", "region", "addressing_style", "request_timeout_s", "bundle_deadline_s", "drain_s")
        sets = [f"checkpoint.remote.{k}={getattr(self.cfg, k)}" for k in keys]
        if self.direct:
            sets += ["checkpoint.volume=local", "checkpoint.remote.parts=direct", "data_plane.snapshot=streamed"]
        return [a for kv in sets for a in ("--set", kv)]

    def unpublished(self) -> set[str]:
        record, _ = read_record(self.store)
        listed = {e.dir for e in record.bundles} if record else set()
        prefix = self.store.key(BUNDLES) + "/"
        return {k[len(prefix) :].split("/", 1)[0] for k, _ in self.store.list(prefix)} - listed

    def newest_counting(self) -> int:
        record, _ = read_record(self.store)
        if record is None:
            return 0
        bundle, _ = newest_counting(self.store, record, lineage=record.lineage, hmac_key=None)
        return bundle.entry.step if bundle else 0

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.rgw.pause_gateway(False)
        self.rgw.stop()


def one_iteration(
    i: int, rng: random.Random, root: Path, trace: Path, work: Path, address: str | None, bucket: Bucket
) -> tuple[str, list[str]]:
    fresh = i > 0 and rng.random() < 0.3
    if fresh:  # a new zone: the checkpoint directory is empty, the bucket is all there is
        shutil.rmtree(root, ignore_errors=True)
        bucket.fresh_zones += 1
    local = ks.steps(root)
    expected = max(local[-1] if local else 0, bucket.newest_counting())
    n_starts = sum(1 for e in read_trace(trace) if e["ev"] == "start")
    before = bucket.unpublished()
    what = run_and_kill(i, rng, root, trace, work, address, bucket, max_steps=expected + 40)
    if bucket.unpublished() - before:
        bucket.partial_uploads += 1
        what += " (left a partial upload)"
    problems = ks.check_resumed(root, trace, n_starts, expected)
    left, found = ks.check_after_preflight(root)
    problems += found + check_bucket(bucket)
    return f"{'empty dir; ' if fresh else ''}{what}; local {left}, bucket newest {bucket.newest}", problems


def run_and_kill(
    i: int, rng: random.Random, root: Path, trace: Path, work: Path, address: str | None, bucket: Bucket,
    *, max_steps: int,
) -> str:  # fmt: skip
    kind = rng.choices(bucket.allowed, weights=[WEIGHTS[k] for k in bucket.allowed])[0]
    bucket.kinds[kind] = bucket.kinds.get(kind, 0) + 1
    env = dict(bucket.rgw.env())
    if kind == "fault":
        point = rng.choice(BUCKET_SAVE_POINTS if bucket.direct else SAVE_POINTS)
        env |= {"SC_APP_FAULT_AT": point, "SC_APP_FAULT_AFTER": str(rng.randint(0, 2))}
        what = f"fault {point} after {env['SC_APP_FAULT_AFTER']}"
    args = ["run", "--checkpoint-dir", str(root), "--max-steps", str(max_steps), "--set", "checkpoint.save_period=1",
            "--set", "checkpoint.keep=4", "--set", f"run.trace_file={trace}", "--set", "run.max_in_job_restores=0",
            *bucket.sets()]  # fmt: skip
    if address:
        args += ["--set", f"ray.address={address}"]
    proc = start_logged(*args, log=work / f"run{i}.log", env=env)
    paused = False
    try:
        if kind == "fault":
            proc.wait(timeout=300)
        else:  # from the run's first bundle on (under load a run may need minutes to get there)
            log = work / f"run{i}.log"
            t0 = time.monotonic()
            with contextlib.suppress(AssertionError):
                wait_for(lambda: "saved step_" in log.read_text(), 300, "the run's first bundle", proc)
            delay = rng.uniform(0.0, 10.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=delay)
            at = time.monotonic() - t0
            what = f"SIGKILL at {at:.1f}s"
            if kind == "mid-upload":
                bucket.rgw.pause_gateway(True)  # the request in flight stalls: the kill lands mid-upload
                paused = True
                stall = rng.uniform(0.5, 3.0)
                time.sleep(stall)
                what = f"radosgw paused at {at:.1f}s, SIGKILL {stall:.1f}s later"
    finally:
        kill_session(proc.pid)
        if paused:
            bucket.rgw.pause_gateway(False)
        if address:
            ks.wait_until_run_is_gone()
    return what


def check_bucket(bucket: Bucket) -> list[str]:
    """Every listed bundle verifies on the bucket; the newest counting step never goes back."""
    record, _ = read_record(bucket.store)
    if record is None:
        return []
    problems = []
    for entry in record.newest_first():
        judged = check(bucket.store, entry, lineage=record.lineage, hmac_key=None, digests=True)
        if not judged.ok:
            problems.append(f"bucket {judged.name} ({entry.dir}) is listed but does not verify: {judged.problems[0]}")
    newest = bucket.newest_counting()
    if newest < bucket.newest:
        problems.append(f"the bucket's newest bundle went back from step {bucket.newest} to {newest}")
    bucket.newest = max(bucket.newest, newest)
    return problems


def final_catch_up(root: Path, trace: Path, work: Path, address: str | None, bucket: Bucket) -> list[str]:
    """One run that ends by itself: the bucket ends with the local newest bundle, and it comes home verified."""
    local = ks.steps(root)
    target = max(local[-1] if local else 0, bucket.newest_counting()) + 2  # (direct: the bucket may be ahead)
    args = ["run", "--checkpoint-dir", str(root), "--max-steps", str(target), "--set", "checkpoint.save_period=1",
            "--set", "checkpoint.keep=4", "--set", f"run.trace_file={trace}", *bucket.sets()]  # fmt: skip
    if address:
        args += ["--set", f"ray.address={address}"]
    proc = start_logged(*args, log=work / "final.log", env=dict(bucket.rgw.env()))
    try:
        rc = proc.wait(timeout=600)
    finally:
        kill_session(proc.pid)
        if address:
            ks.wait_until_run_is_gone()
    if rc != 0:
        return [f"the final run exited {rc} (see {work / 'final.log'})"]
    problems = check_bucket(bucket)
    if bucket.newest != target:
        problems.append(f"after the final run the bucket's newest is step {bucket.newest}, the local {target}")
    record, _ = read_record(bucket.store)
    home = bring_newer(bucket.store, record, work / "elsewhere", local_newest=lambda: None,
                       lineage=record.lineage if record else None, hmac_key=None, concurrency=4)  # fmt: skip
    if home is None or home.step != target or not verify_bundle(home.path).ok:
        problems.append(f"the bucket's newest did not come home verified into an empty dir: {home}")
    return problems
