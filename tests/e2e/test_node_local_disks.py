"""Nodes that do not share the checkpoint directory: a Ray cluster whose worker node sees a disk of its own at the
checkpoint path (``tests/support/node_disks.py``: a mount namespace with a tmpfs over it — a worker pod with an
emptyDir or a per-pod ReadWriteOnce volume), as on Kubernetes with ``checkpoint.volume: local`` and more than one
pod.

What must hold (docs/object-storage.md "Without a shared volume"):
* TransferQueue's storage units may run there: their parts of a bundle stream through the controller's process on
  a save and through the driver's on a restore, which see the directory — the run saves and resumes, and its
  bundles verify.
* A trainer rank there (it writes and reads the policy in the directory itself) is one clear line naming the rank,
  its host and what to do, exit 2, before anything is written or moved: on a resume, the bundles it could not read
  are not quarantined as "does not load into the configured model" (the bug this guards: step_4, a good bundle, was
  moved aside and the run fell back to older ones), and a fresh run stops before its first step, not at its first
  save after hours of training.
* With ``checkpoint.volume: local`` and a bucket (the suite's radosgw), three trainer ranks, one on the head and
  two there, and those are at home: a rank there stages its part of each bundle on its own disk and the controller
  gathers it into the bundle, which verifies and is uploaded; a run in another empty directory brings the newest
  bundle home from the bucket, sends its ``policy/`` once to the node for both its ranks, resumes them and trains
  on, and when one of those ranks' process is SIGKILLed the run restores in-job and sends the node the bundle's
  ``policy/`` again, for the survivor and the killed rank's successor (``sc_app.checkpoint.node_parts``).
* The same on the hf backend with two FSDP ranks, each on a node with a disk of its own (a second such node), so
  that no rank sees the directory: each rank's DCP shard (and rank 0's ``.metadata``) is gathered into a bundle that
  verifies, and a run in another empty directory sends the bucket's bundle to both ranks, which restore its
  weights and Adam state bit for bit (DCP's own reader as the oracle).
* That second run with ``checkpoint.remote.parts: direct`` (a job switching mode on the same bucket): each rank
  uploads its own shard, the bundle is committed on the bucket alone (no ``step_N`` renamed on the head) and
  verifies there; when a rank is SIGKILLed after step 6's save, the in-job restore brings step_6 home from the
  bucket first and trains on (``sc_app.checkpoint.remote.parts``).
"""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.bundles import tree
from tests.support.cli import InProcess
from tests.support.hf import ARITHMETIC, hf_world, make_model_dir, policy_oracle
from tests.support.node_disks import OwnDiskNode, skip_reason, wait_for_nodes
from tests.support.proc import (
    Finished,
    actor_pids,
    finish,
    read_trace,
    run_args,
    sc_app,
    start_logged,
    step_bundles,
    trace_runs,
    wait_for,
)
from tests.support.rgw import ACCESS_KEY, SECRET_KEY

pytestmark = pytest.mark.slow

if skip_reason():
    pytest.skip(skip_reason() or "", allow_module_level=True)

from tests.support.cluster import start_cluster  # noqa: E402

NOT_SHARED = re.compile(
    r"^sc-app: error: trainer rank 0 on host \S+ does not see the run's checkpoint directory \(.+\); every process "
    r"that writes or reads bundles .+ must see checkpoint\.dir",
    re.M,
)


@dataclass
class Runs:
    ckpt: Path
    saved: Finished  # trainer on the head, storage unit on the node with its own disk
    continued: Finished  # the same placement, resuming from ``saved``'s step_4
    before_resume: dict[str, str]
    resumed: Finished  # trainer on the node with its own disk, resuming from ``continued``'s bundles
    after_resume: dict[str, str]
    fresh_dir: Path
    fresh: Finished  # the same, in a directory without bundles


def bundle_files(ckpt: Path) -> dict[str, str]:
    """Every file of a bundle, a tmp dir or the quarantine, with its sha256 (not the lease or the logs)."""
    return {rel: digest for rel, digest in tree(ckpt).items() if re.match(r"(step_|tmp_step_|quarantine/)", rel)}


def _placed(address: str, ckpt: Path, trace: Path, max_steps: int, *, trainer: str, units: str) -> list[str]:
    placement = [f"ray.address={address}", f"trainer.resources={{{trainer}: 1}}", "generation.resources={head: 1}"]
    placement.append(f"data_plane.storage_node_resource={units}")
    return run_args(ckpt, trace, max_steps, *[a for kv in placement for a in ("--set", kv)])


@dataclass
class Cluster:
    address: str
    base: Path
    ckpt: Path  # the head's directory; the node has a tmpfs of its own at this path
    node_sid: int  # the session of the node's processes (its raylet and every worker on it)
    # a third node with a tmpfs of its own at ``ckpt`` too: "disk_rank" is on both nodes with their own disk
    own_disks: tuple[OwnDiskNode, ...]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("own_disks")
    ckpt = base / "ckpt"
    ckpt.mkdir()
    # every pod's credentials for the suite's bucket (as a ServiceAccount gives them on Kubernetes): the controller
    # actor on the head and, with checkpoint.remote.parts=direct, the trainer ranks upload
    creds = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    saved_env = {k: os.environ.get(k) for k in creds}
    os.environ.update(creds)  # the head's raylet and workers start from this process's environment
    # "rank": with three trainer ranks, one on the head and two on the node with its own disk
    ray_cluster = start_cluster(num_cpus=5, include_dashboard=False, resources={"head": 4, "rank": 1})
    node = OwnDiskNode.start(ray_cluster.address, ckpt, base / "node.log", num_cpus=3,
                             resources={"own_disk": 4, "rank": 2, "disk_rank": 1}, env=creds)  # fmt: skip
    other = None
    try:  # one node at a time: two raylets starting at once on 2 loaded cores can miss Ray's start timeout
        wait_for_nodes(ray_cluster.address, 2, node)
        other = OwnDiskNode.start(ray_cluster.address, ckpt, base / "other.log", num_cpus=1,
                                  resources={"disk_rank": 1}, env=creds)  # fmt: skip
        wait_for_nodes(ray_cluster.address, 3, other)
        yield Cluster(ray_cluster.address, base, ckpt, node.proc.pid, (node, other))
    finally:
        if other is not None:
            other.stop()
        node.stop()
        ray_cluster.shutdown()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def runs(cluster: Cluster) -> Runs:
    base, ckpt = cluster.base, cluster.ckpt
    trace = base / "trace.jsonl"
    saved = sc_app(*_placed(cluster.address, ckpt, trace, 4, trainer="head", units="own_disk"), timeout=300)
    continued = sc_app(*_placed(cluster.address, ckpt, trace, 6, trainer="head", units="own_disk"), timeout=300)
    before = bundle_files(ckpt)
    resumed = sc_app(*_placed(cluster.address, ckpt, trace, 8, trainer="own_disk", units="head"), timeout=300)
    after = bundle_files(ckpt)
    fresh_dir = ckpt / "fresh"  # on the node: under its own (empty) disk, so not there
    fresh = sc_app(*_placed(cluster.address, fresh_dir, trace, 4, trainer="own_disk", units="head"), timeout=300)
    return Runs(ckpt, saved, continued, before, resumed, after, fresh_dir, fresh)


def test_storage_units_without_the_directory_stream_through_the_controller(cli: InProcess, runs: Runs) -> None:
    assert runs.saved.rc == 0, runs.saved.out[-3000:]
    out = runs.continued.out
    assert runs.continued.rc == 0, out[-3000:]
    assert "resuming from" in out and "(step 4)" in out, out[-3000:]
    # the restore read the unit's part of step_4 in the driver: its node has another disk at that path
    assert re.search(r"does not see \S+/step_4/data_plane: unit \S+'s stream runs in this process", out), out[-3000:]
    assert sorted(step_bundles(runs.ckpt)) == [2, 4, 6]
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(runs.ckpt))
    assert verify.rc == 0 and "step_6: verified" in verify.out, verify.out


def test_a_trainer_without_the_directory_is_one_line_and_no_bundle_moves(runs: Runs) -> None:
    out = runs.resumed.out
    assert runs.resumed.rc == 2, out[-3000:]
    assert NOT_SHARED.search(out), out[-3000:]
    assert "Traceback" not in out and "quarantined" not in out and "does not load" not in out, out[-3000:]
    assert "resuming from" in out and "(step 6)" in out  # it chose step_6, then stopped instead of falling back
    assert runs.after_resume == runs.before_resume, "a bundle changed, moved or was added"
    assert not (runs.ckpt / "quarantine").exists()


def test_a_fresh_run_with_a_trainer_without_the_directory_stops_before_training(runs: Runs) -> None:
    out = runs.fresh.out
    assert runs.fresh.rc == 2, out[-3000:]
    assert NOT_SHARED.search(out), out[-3000:]
    assert "Traceback" not in out and not re.search(r"^step\s+1/", out, re.M), out[-3000:]
    assert not step_bundles(runs.fresh_dir) and not list(runs.fresh_dir.glob("tmp_step_*"))


# ------------------------------------------------------------------ checkpoint.volume: local, with a bucket


def _volume_local(rgw: Any, prefix: str) -> list[str]:
    """``checkpoint.volume=local`` with the suite's bucket, under a prefix of this run's own."""
    remote = [f"checkpoint.remote.url=s3://{rgw.bucket}/{prefix}-{uuid.uuid4().hex[:6]}"]
    remote += [f"checkpoint.remote.endpoint={rgw.endpoint}", "checkpoint.remote.region=us-east-1"]
    return [*remote, "checkpoint.remote.addressing_style=path", "checkpoint.volume=local"]


@dataclass
class LocalRuns:
    first: Path
    saved: Finished  # 3 trainer ranks, 1 on the head and 2 on the node with its own disk, a fresh dir: step_2, 4
    second: Path
    resumed: Finished  # another empty directory, the same bucket: step_4 brought home, the node sent one policy/
    # for its two ranks; ...
    killed: int  # ... after 3 more steps one of the node's ranks SIGKILLed: restored in-job (the live ranks reset
    # in place), the node sent the policy once more for its survivor and the killed rank's successor
    left_on_node: list[str]  # files under the node's own .node_parts/ after both runs


@pytest.fixture(scope="module")
def local_runs(cluster: Cluster, rgw: Any) -> LocalRuns:
    extra = [a for kv in _volume_local(rgw, "own-disks") for a in ("--set", kv)]
    first, second = cluster.ckpt / "local-a", cluster.ckpt / "local-b"  # on the node: under its own disk

    def args(ckpt: Path, steps: int, trace: Path) -> list[str]:
        ranks = ["--set", "trainer.num_workers=3"]  # one on the head, two on the node with its own disk
        ranks += ["--set", "run.reset_timeout_s=60"]  # a warm reset that hangs falls back well within the test's wait
        return [*_placed(cluster.address, ckpt, trace, steps, trainer="rank", units="head"), *ranks, *extra]

    saved = sc_app(*args(first, 4, cluster.base / "local-a.jsonl"), env=rgw.env(), timeout=300)
    trace, log = cluster.base / "local-b.jsonl", cluster.base / "local-b.log"
    proc = start_logged(*args(second, 10, trace), log=log, env=rgw.env())
    try:
        trained = lambda: sum(e["ev"] == "train" for e in read_trace(trace)) >= 3  # noqa: E731
        wait_for(trained, 300, "3 train steps after the resume from the bucket", proc, log=log)
        victim, _ = sorted(actor_pids(cluster.node_sid, "TrainerWorker"))  # the other one there stays
        os.kill(victim, signal.SIGKILL)
        resumed = finish(proc, 300, "the run resumed from the bucket, its trainer rank killed")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    left = [f for d in (first, second) for f in cluster.own_disks[0].files_under(d / ".node_parts")]
    return LocalRuns(first, saved, second, Finished(resumed.rc, log.read_text()), victim, left)


def test_with_volume_local_a_trainer_on_its_own_disk_writes_its_part_and_the_bundle_holds_it(
    cli: InProcess, local_runs: LocalRuns
) -> None:
    out = local_runs.saved.out
    assert local_runs.saved.rc == 0, out[-3000:]
    assert sorted(step_bundles(local_runs.first)) == [2, 4]
    listing = cli("ckpt", "verify", "--checkpoint-dir", str(local_runs.first))
    assert listing.rc == 0 and "step_4: verified" in listing.out, listing.out
    for step in (2, 4):
        policy = local_runs.first / f"step_{step}" / "policy"
        assert sorted(p.name for p in policy.iterdir()) == ["model.pt", "optimizer.pt"], "the rank's part is there"
    assert not (local_runs.first / ".node_parts").exists(), "staged on the node's disk, never on the head's"
    assert "uploaded step_4 (" in out, out[-3000:]


def test_with_volume_local_a_new_directory_resumes_from_the_bucket_and_the_rank_gets_the_policy(
    local_runs: LocalRuns,
) -> None:
    out = local_runs.resumed.out
    assert local_runs.resumed.rc == 0, out[-3000:]
    assert "resuming from" in out and "(step 4)" in out, out[-3000:]
    # one copy for the node's two ranks: at the start, then at the in-job restore (its survivor and the killed
    # rank's successor)
    sent = re.findall(r"sent (step_\d+)/policy \(2 files, [0-9.]+ MiB\) to 1 node\(s\) .*\(2 trainer rank\(s\)\)", out)
    assert len(sent) == 2 and sent[0] == "step_4", out[-3000:]
    assert re.search(r"fault trainer\S*: recovered", out), out[-3000:]
    assert "done: step 10" in out, out[-3000:]
    assert 10 in step_bundles(local_runs.second)
    step_10 = local_runs.second / "step_10" / "policy"
    assert sorted(p.name for p in step_10.iterdir()) == ["model.pt", "optimizer.pt"]
    assert "uploaded step_10 (" in out, out[-3000:]
    assert not (local_runs.second / ".node_parts").exists()
    assert local_runs.left_on_node == [], "the node's staged parts and sent copies are freed once used"


# ------------------------------------------------- the hf backend's DCP shards, both ranks on disks of their own

HF_LR = 1e-2


@dataclass
class HfLocalRuns:
    url: str
    model: Path
    first: Path
    saved: Finished  # 2 fsdp ranks, one on each node with its own disk (none sees the directory), parts gathered by
    # the head (parts=via_head): step_2, step_4, uploaded
    second: Path
    direct: Finished  # another empty directory, the same bucket, checkpoint.remote.parts=direct: step_4 brought home
    # and sent to both ranks; step_6 committed on the bucket by the ranks' own uploads; then one rank SIGKILLed:
    # the in-job restore brings step_6 home first; done at step 8
    trace: Path
    left_on_nodes: list[str]  # files under the nodes' own .node_parts/ after both runs


def _hf_placement(cluster: Cluster) -> list[str]:
    placement = [f"ray.address={cluster.address}", "trainer.resources={disk_rank: 1}", "generation.resources={head: 1}"]
    placement += ["data_plane.storage_node_resource=head", "trainer.num_workers=2", "trainer.strategy=fsdp"]
    return [*placement, "task.reward=sc_app.rl.hf.rewards:numeric_match", "run.reset_timeout_s=120"]


@pytest.fixture(scope="module")
def hf_local_runs(cluster: Cluster, rgw: Any) -> HfLocalRuns:
    base = cluster.base / "hf"  # beside the checkpoint path, not under it: every node sees the model and the data
    base.mkdir()
    reward = ("unused_reward", "def score(**_):\n    return 0.0\n")  # the workers' nodes import sc_app's own below
    world = hf_world(base, model=make_model_dir(base / "model"), rows=ARITHMETIC * 4, reward=reward, lr=HF_LR)
    remote = _volume_local(rgw, "hf-own-disks")
    first, second = cluster.ckpt / "hf-a", cluster.ckpt / "hf-b"  # under the nodes' own disks there

    def args(ckpt: Path, steps: int, *extra: str) -> list[str]:
        return replace(world, ckpt=ckpt).run_args(steps, *remote, *_hf_placement(cluster), *extra)

    saved = sc_app(*args(first, 4), env=rgw.env(), timeout=420)
    log = cluster.base / "hf-direct.log"
    proc = start_logged(*args(second, 8, "checkpoint.remote.parts=direct"), log=log, env=rgw.env())
    try:
        saved_6 = lambda: any(e["ev"] == "save" and e.get("step") == 6 for e in read_trace(world.trace))  # noqa: E731
        wait_for(saved_6, 400, "the bundle of step 6 committed on the bucket", proc, log=log)
        victim = sorted(actor_pids(cluster.own_disks[1].proc.pid, "TrainerWorker"))[0]
        os.kill(victim, signal.SIGKILL)
        direct = finish(proc, 400, "the run resumed from the bucket, a trainer rank killed after step 6's save")
    finally:
        if proc.poll() is None:
            finish(proc, 1, "cleanup")
    left = [f for n in cluster.own_disks for d in (first, second) for f in n.files_under(d / ".node_parts")]
    url = next(a.split("=", 1)[1] for a in remote if a.startswith("checkpoint.remote.url="))
    return HfLocalRuns(url, world.model, first, saved, second, Finished(direct.rc, log.read_text()), world.trace, left)


def test_with_volume_local_both_ranks_dcp_shards_are_gathered_into_a_bundle_that_verifies(
    cli: InProcess, hf_local_runs: HfLocalRuns
) -> None:
    runs = hf_local_runs
    out = runs.saved.out
    assert runs.saved.rc == 0, out[-3000:]
    assert sorted(step_bundles(runs.first)) == [2, 4]
    listing = cli("ckpt", "verify", "--checkpoint-dir", str(runs.first))
    assert listing.rc == 0 and "step_2: verified" in listing.out and "step_4: verified" in listing.out, listing.out
    for step in (2, 4):
        policy = runs.first / f"step_{step}" / "policy"
        shards = {p.name for p in policy.iterdir() if p.suffix == ".distcp"}
        assert shards == {"__0_0.distcp", "__1_0.distcp"}, (step, shards)  # each rank's, from its own disk
        assert (policy / ".metadata").is_file()  # rank 0's, written as DCP's coordinator on its own disk
    assert not (runs.first / ".node_parts").exists(), "staged on the nodes' disks, never on the head's"
    assert "uploaded step_4 (" in out, out[-3000:]


def test_with_volume_local_both_ranks_resume_the_bundles_exact_state_from_the_bucket(
    hf_local_runs: HfLocalRuns,
) -> None:
    runs = hf_local_runs
    out = runs.direct.out
    assert runs.direct.rc == 0, out[-3000:]
    assert "resuming from" in out and "(step 4)" in out, out[-3000:]
    sent = r"sent step_4/policy \(\d+ files, [0-9.]+ MiB\) to 2 node\(s\) .*\(2 trainer rank"
    assert re.search(sent, out), out[-3000:]
    start = trace_runs(runs.trace)[1][0]
    assert start["step"] == 4
    oracle, _ = policy_oracle(runs.first / "step_4", runs.model, HF_LR)
    assert start["restored_policy"] == oracle, "weights and Adam state equal the bundle's, bit for bit"
    assert runs.left_on_nodes == [], "the nodes' staged shards and sent copies are freed once used"


# ------------------------------------- checkpoint.remote.parts=direct: each rank uploads its own part to the bucket


def _bucket(rgw: Any, url: str) -> Any:
    from sc_app.checkpoint.remote.store import Store
    from sc_app.config.remote import RemoteConfig

    cfg = RemoteConfig(url=url, endpoint=rgw.endpoint, region="us-east-1", addressing_style="path")
    return Store(cfg, client=rgw.client())


def test_with_parts_direct_each_rank_uploads_its_shard_and_the_bundle_counts_on_the_bucket_alone(
    rgw: Any, hf_local_runs: HfLocalRuns
) -> None:
    from sc_app.checkpoint.remote.bundles import check
    from sc_app.checkpoint.remote.fence import read_record

    runs = hf_local_runs
    out = runs.direct.out
    assert runs.direct.rc == 0, out[-3000:]
    assert re.search(r"uploaded step_6 \([1-9][0-9.]* MiB", out), "the ranks' shards counted in its bytes"
    record, _ = read_record(_bucket(rgw, runs.url))
    assert record is not None
    # committed on the bucket: this save's own dir, step_N.<run>.e<epoch>.f<local fencing epoch> (a run id is hex: it
    # may hold ".f" itself, as in step_2.f3c0….e1 of the first run, uploaded via the head)
    direct = {b.step: b for b in record.bundles if re.fullmatch(rf"step_{b.step}\.{b.run_id}\.e{b.epoch}\.f\d+", b.dir)}
    assert sorted(direct) == [6, 8] and {2, 4} <= {b.step for b in record.bundles}
    for entry in direct.values():
        verdict = check(_bucket(rgw, runs.url), entry, lineage=record.lineage, hmac_key=None, digests=True)
        assert verdict.ok and verdict.manifest is not None, verdict.problems
        shards = {f for f in verdict.manifest.files if f.endswith(".distcp")}
        assert shards == {"policy/__0_0.distcp", "policy/__1_0.distcp"}, shards  # each rank's, from its own disk
        assert "policy/.metadata" in verdict.manifest.files
    assert set(step_bundles(runs.second)) == {4, 6}, "no bundle renamed on the head: only those brought home"
    assert not list(runs.second.glob("tmp_step_*")), "each save's sealed tmp dir goes once published"


def test_with_parts_direct_an_in_job_restore_brings_the_buckets_newest_home_first(hf_local_runs: HfLocalRuns) -> None:
    out = hf_local_runs.direct.out
    assert hf_local_runs.direct.rc == 0, out[-3000:]
    sent = re.findall(r"sent (step_\d+)/policy \(\d+ files, [0-9.]+ MiB\) to \d node\(s\)", out)
    assert sent == ["step_4", "step_6"], out[-3000:]  # at the start, then step_6 from the bucket for the restore
    assert re.search(r"fault trainer\S*: recovered .*restored step_6", out), out[-3000:]
    assert "done: step 8" in out, out[-3000:]
