"""The rendered NetworkPolicy enforced between pod stand-ins, with a real multi-node job running through it.

Every pod of a rendered RayJob attempt is a network namespace on one bridge (``podsim``); the rendered
NetworkPolicy becomes nftables rules on each pod's ingress (``netpol_sim``: peers → the stand-ins' IPs, ports and
``endPort`` ranges, connection tracking for replies, the node's own address admitted as Calico/Cilium do); the
head and worker run the ``ray start`` command line KubeRay builds from the rendered ``rayStartParams`` as PID 1 of
their own PID namespace, the worker waits in KubeRay's ``wait-gcs-ready`` init container and reaches the head
through its Service name (a cluster DNS stand-in); the K8sJobMode submitter runs KubeRay's submit command from its
own pod (``kuberay_sim``). The job is ``sc-app run`` with the rendered ConfigMap; the trainer and the TransferQueue
storage unit are placed on the worker (a custom Ray resource in the worker group's ``rayStartParams``), the
controller on the head, so training crosses pods on TransferQueue's ZMQ ports. The checkpoint PVC is one host
directory mounted in every pod (the RWX stand-in).

* with the chart's policy the job completes, its bundles verify, and connections the pre-fix policy would have
  dropped were admitted;
* with the pre-fix policy (``fixtures/networkpolicy-before-fix.yaml``) the job hangs: it is stopped after
  ``HANG_BOUND_S`` and the test reports the dropped connections per port and the process listening there.

Needs root and ``nft`` (nftables; ``make test`` installs it when run as root). Only a live cluster with an
enforcing CNI can prove the CNI's own behaviour (``ops/cluster-smoke.sh``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s import netpol_sim
from tests.k8s.k8s_helpers import CHART_DIR, by_kind, load_values, objects, render, sim_worker_values
from tests.k8s.kuberay_sim import RayJobSim
from tests.k8s.netpol_sim import Attempt, Ingress, PodRef
from tests.k8s.podsim import Network, Pod, Volumes, image_env, missing_tools

pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
_MISSING = missing_tools() + ([] if shutil.which("nft", path="/usr/sbin:/usr/bin:/sbin:/bin") else ["nft (nftables)"])
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"needs {', '.join(_MISSING)} to build network namespaces and packet filters "
    "(run `make test` as root; it installs nftables)",
)

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
RELEASE, NS = "np", "ml"  # the fixture was rendered for this release and namespace
MAX_STEPS = 4
JOB_BOUND_S = 600  # a hang under the chart's policy fails the test instead of blocking the suite
HANG_BOUND_S = 90  # how long the pre-fix run is given (the chart's policy finishes its job in ~30 s here)
OPERATOR = ("kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"})
PROMETHEUS = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
NEIGHBOUR = (NS, {"app": "other"})  # another app in the release's namespace
STRANGER = ("other", {"app.kubernetes.io/name": "sc-app", "app.kubernetes.io/instance": RELEASE})


def _values() -> dict[str, Any]:
    """The two-pod release (one CPU worker carries the trainer and the TransferQueue storage unit)."""
    values = sim_worker_values()
    values["config"]["run"]["max_steps"] = MAX_STEPS
    values["networkPolicy"] = {"monitoringNamespace": PROMETHEUS[0]}
    return values


def _render() -> list[dict[str, Any]]:
    objs = objects(render(_values(), name=RELEASE, namespace=NS))
    for obj in objs:
        obj["metadata"]["namespace"] = NS  # what `helm install -n ml` gets from the API server
    return objs


def _old_policy() -> dict[str, Any]:
    policy = yaml.safe_load((HERE / "fixtures" / "networkpolicy-before-fix.yaml").read_text())
    policy["metadata"]["namespace"] = NS
    return policy


@dataclass
class Cluster:
    """One RayJob attempt plus outside pods, all under one set of policies."""

    net: Network
    sim: RayJobSim
    outside: dict[str, Pod]
    pvc: Path
    ingress: dict[str, Ingress]  # pod name → what it admits

    @property
    def pods(self) -> list[Pod]:
        return self.sim.pods + list(self.outside.values())

    def drops(self) -> list[Attempt]:
        return [d for p in self.pods for d in netpol_sim.drops(p.netns, p.name)]

    def attempts(self) -> list[Attempt]:
        return [a for p in self.pods for a in netpol_sim.attempts(p.netns, p.name)]

    def name_of(self, ip: str) -> str:
        return next((p.name for p in self.pods if p.ip == ip), ip)

    def sim_ip(self, name: str) -> str:
        return next(p.ip for p in self.pods if p.name == name)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []
    nets: list[Network] = []

    def make(policies: list[dict[str, Any]] | None = None) -> Cluster:
        objs = _render()
        (rayjob,) = by_kind(objs, "RayJob")
        policies = by_kind(objs, "NetworkPolicy") if policies is None else policies
        root = tmp_path / f"c{len(nets)}"
        root.mkdir()
        net = Network(f"scnp{os.getpid() % 100000}{len(nets)}", root)
        nets.append(net)
        pvc = root / "pvc"
        pvc.mkdir()
        volumes = Volumes.of_release(objs, pvc)
        sim = RayJobSim(rayjob, net, root, volumes, image_env(), NS)
        sim.create_pods()
        outside = {name: Pod(net, name, ns, labels, root)
                   for name, (ns, labels) in {"operator": OPERATOR, "prometheus": PROMETHEUS,
                                              "neighbour": NEIGHBOUR, "stranger": STRANGER}.items()}
        cluster = Cluster(net, sim, outside, pvc, {})
        made.append(cluster)
        refs = [PodRef(p.name, p.namespace, p.labels, p.ip) for p in cluster.pods]
        for pod, ref in zip(cluster.pods, refs, strict=True):
            cluster.ingress[pod.name] = netpol_sim.ingress_for(ref, policies, refs)
            netpol_sim.apply(pod.netns, cluster.ingress[pod.name], [net.node_ip])
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.sim.close()
            for pod in cluster.outside.values():
                pod.close()
        for net in nets:
            net.close()


# --- reachability: what each kind of peer may open ------------------------------------------------------------------
def _probe_ports() -> dict[str, int]:
    """Every pinned Ray port (the chart's defaults, which _values() keeps), one of the worker range, one unpinned."""
    ports = {k: int(v) for k, v in load_values(CHART_DIR / "values.yaml")["rayPorts"].items()}
    ports["worker-range"] = (ports.pop("minWorkerPort") + ports.pop("maxWorkerPort")) // 2
    ports["unpinned"] = 45678  # where TransferQueue's ZMQ sockets and gloo/NCCL listen: an ephemeral port
    return ports


def _reachability(cluster: Cluster, sources: list[Pod], dests: list[Pod]) -> dict[tuple[str, str, str], bool]:
    ports = _probe_ports()
    listeners = []
    try:
        for dest in dests:
            listeners.append(subprocess.Popen(
                ["ip", "netns", "exec", dest.netns, sys.executable, str(HERE / "tcp_probe.py"), "listen",
                 *map(str, sorted(set(ports.values())))], stdout=subprocess.PIPE, text=True, start_new_session=True))
        for proc in listeners:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        targets = {f"{d.ip}:{p}": (d.name, name) for d in dests for name, p in ports.items()}
        probes = {src.name: subprocess.Popen(
            ["ip", "netns", "exec", src.netns, sys.executable, str(HERE / "tcp_probe.py"), "connect", "3", *targets],
            stdout=subprocess.PIPE, text=True, start_new_session=True) for src in sources}  # side by side
        out: dict[tuple[str, str, str], bool] = {}
        for name, proc in probes.items():
            stdout, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, stdout
            for target, ok in json.loads(stdout).items():
                out[(name, *targets[target])] = ok
        return out
    finally:
        for proc in listeners:
            os.killpg(proc.pid, 9)
            proc.wait()


def test_each_peer_reaches_exactly_what_the_policy_admits(cluster_factory: Any) -> None:
    c = cluster_factory()
    head, worker, submitter = c.sim.head, c.sim.workers[0], c.sim.submitter
    assert head is not None and submitter is not None
    ports = _probe_ports()
    got = _reachability(c, [head, worker, submitter, *c.outside.values()], [head, worker])
    for (src, dest, port), ok in got.items():
        if src in (head.name, worker.name, submitter.name):
            expected = True  # the release's own pods: every port
        elif src == "operator":
            expected = port == "dashboard"
        elif src == "prometheus":
            expected = port == "metrics"
        else:
            expected = False
        assert ok is expected, f"{src} -> {dest}:{ports[port]} ({port}): {'open' if ok else 'blocked'}"
    blocked = {(c.name_of(d.source), d.pod, d.port) for d in c.drops()}
    assert ("stranger", head.name, ports["gcs"]) in blocked, "drops are counted per source and port"

    old = cluster_factory([_old_policy()])
    got = _reachability(old, [old.sim.workers[0]], [old.sim.head])
    assert all(ok for (_, _, port), ok in got.items() if port != "unpinned"), got
    assert not got[(old.sim.workers[0].name, old.sim.head.name, "unpinned")], "the pre-fix policy's gap"


# --- the job --------------------------------------------------------------------------------------------------------
@dataclass
class JobRun:
    succeeded: bool
    submitter_rc: int | None
    submitter_log: str
    bundles: list[str]
    seconds: float


def _bundles(pvc: Path) -> list[str]:
    return sorted(p.name for p in pvc.glob("step_*"))


def _listeners(pod: Pod) -> dict[int, str]:
    """Listening TCP port → the command line of the process holding it (read from the host's /proc)."""
    out = subprocess.run(["ip", "netns", "exec", pod.netns, "ss", "-Hltnp"], capture_output=True, text=True,
                         check=False).stdout
    found = {}
    for line in out.splitlines():
        fields = line.split()
        port = int(fields[3].rsplit(":", 1)[1])
        if "pid=" in line:
            pid = line.split("pid=", 1)[1].split(",", 1)[0]
            try:
                found[port] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()[:60]
            except OSError:
                found[port] = "?"
    return found


def _run_job(c: Cluster, bound_s: float) -> JobRun:
    """Start the attempt (head with preflight, worker, readiness), submit, wait for the submitter ≤ ``bound_s``."""
    start = time.monotonic()
    init = c.sim.start_head()
    assert json.loads(init[0].out)["decision"] == "fresh", init[0].out
    c.sim.start_workers()
    c.sim.wait_ready()
    c.sim.submit()
    assert c.sim.submitter is not None
    deadline = time.monotonic() + bound_s
    rc = None
    while rc is None and time.monotonic() < deadline:
        rc = c.sim.submitter.wait(timeout=min(5.0, max(deadline - time.monotonic(), 0.1)))
    out = c.sim.submitter.log()
    return JobRun(rc == 0 and "succeeded" in out, rc, out, _bundles(c.pvc), time.monotonic() - start)


def _placement(c: Cluster) -> dict[str, set[str]]:
    """Ray actor class → the pods its actors ran on (Ray's state API, asked from inside the head)."""
    code = ("import json\nfrom ray.util.state import list_actors, list_nodes\n"
            "nodes = {n.node_id: n.node_ip for n in list_nodes(limit=100)}\n"
            "print(json.dumps(sorted({(a.class_name, nodes.get(a.node_id, '?')) "
            "for a in list_actors(limit=10000, detail=True)})))\n")
    assert c.sim.head is not None
    res = c.sim.head.exec(["python", "-c", code], timeout=120)
    assert res.rc == 0, res.out[-3000:]
    placement: dict[str, set[str]] = {}
    for cls, ip in json.loads(res.out.strip().splitlines()[-1]):
        placement.setdefault(cls, set()).add(c.name_of(ip))
    return placement


@pytest.mark.slow
@pytest.mark.pods
@pytest.mark.timeout(900)
def test_job_completes_across_pods_under_the_chart_policy(cluster_factory: Any) -> None:
    c = cluster_factory()
    run = _run_job(c, JOB_BOUND_S)
    head, worker = c.sim.head, c.sim.workers[0]
    assert head is not None
    drops = c.drops()
    assert run.succeeded, (f"job did not succeed (submitter rc {run.submitter_rc}); dropped: "
                           f"{[str(d) for d in drops]}\n{run.submitter_log[-4000:]}")
    assert f"done: step {MAX_STEPS}" in run.submitter_log, run.submitter_log[-3000:]
    assert run.bundles and run.bundles[-1] == f"step_{MAX_STEPS}", run.bundles
    verify = subprocess.run([str(Path(sys.executable).parent / "sc-app"), "ckpt", "verify", "--checkpoint-dir",
                             str(c.pvc), "--json"], capture_output=True, text=True, timeout=300)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    placement = _placement(c)
    assert placement.get("SingleControllerActor") == {head.name}, placement
    assert placement.get("TrainerWorker") == {worker.name}, placement
    assert placement.get("SimpleStorageUnit") == {worker.name}, placement
    release = {p.ip for p in c.sim.pods}
    assert not [d for d in drops if d.source in release], f"release traffic dropped: {[str(d) for d in drops]}"

    everyone = [i.pod for i in c.ingress.values()]
    old = {p: netpol_sim.ingress_for(c.ingress[p].pod, [_old_policy()], everyone) for p in (head.name, worker.name)}
    only_new = [a for a in c.attempts() if a.pod in old and a.source in release
                and not old[a.pod].admits(a.source, a.protocol, a.port)]
    assert only_new, "the job never used a port the pre-fix policy blocked: the comparison would prove nothing"
    log.warning("chart policy: job succeeded in %.0f s (pods up to done), bundles %s; connections the pre-fix "
                "policy would have dropped: %s", run.seconds, run.bundles,
                [f"{c.name_of(a.source)} -> {a.pod} {a.protocol}/{a.port}" for a in only_new])


@pytest.mark.slow
@pytest.mark.pods
@pytest.mark.timeout(900)
def test_job_hangs_under_the_pre_fix_policy(cluster_factory: Any) -> None:
    c = cluster_factory([_old_policy()])
    run = _run_job(c, HANG_BOUND_S)
    # The pods still run: who listens on the blocked ports, and which connects are still waiting for an answer.
    by_ip = {p.ip: p for p in c.sim.pods}
    drops = [d for d in c.drops() if d.source in by_ip]
    listening = {(p.name, port): cmd for p in c.sim.pods if p.running() for port, cmd in _listeners(p).items()}
    waiting = {(src.ip, peer) for src in c.sim.pods if src.running() for peer in _syn_sent(src)}
    report = [f"{c.name_of(d.source)} -> {d.pod} {d.protocol}/{d.port}: {d.packets} packets dropped, "
              f"listening: {listening.get((d.pod, d.port), '?')}"
              f"{', connect still waiting' if (d.source, f'{c.sim_ip(d.pod)}:{d.port}') in waiting else ''}"
              for d in drops]
    log.warning("pre-fix policy: job %s after %.0f s, bundles %s; dropped: %s",
                "succeeded" if run.succeeded else "stuck", run.seconds, run.bundles, report)
    assert not run.succeeded, f"the job succeeded under the pre-fix policy:\n{run.submitter_log[-3000:]}"
    assert run.submitter_rc is None, (f"the job ended (rc {run.submitter_rc}) instead of hanging: {report}\n"
                                      f"{run.submitter_log[-3000:]}")
    assert drops, "the job hung but no connection was dropped: something other than the policy is wrong"
    assert not run.bundles, run.bundles
    assert any("connect still waiting" in line for line in report), (
        f"no dropped connection was still being attempted at the bound: {report}")


def _syn_sent(pod: Pod) -> list[str]:
    """Peers ("ip:port") of the pod's TCP connects still waiting for a SYN-ACK."""
    out = subprocess.run(["ip", "netns", "exec", pod.netns, "ss", "-Htn", "state", "syn-sent"], capture_output=True,
                         text=True, check=False).stdout
    return [line.split()[-1] for line in out.splitlines() if line.strip()]
