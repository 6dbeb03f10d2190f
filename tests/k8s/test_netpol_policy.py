"""The chart's NetworkPolicy as rendered, and the NetworkPolicy semantics of ``netpol_sim`` (pure logic, no root).

The policy contract: every port and protocol between the release's own pods (as KubeRay labels them), the dashboard
port from the operator's namespace (+ ``extraDashboardPeers``), the metrics port from
``networkPolicy.monitoringNamespace`` when set, nothing else. ``tests/k8s/test_netpol_enforced.py`` enforces the
same objects with nftables between network namespaces and runs a real job through them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.k8s.k8s_helpers import BASE_VALUES, by_kind, objects, pod_templates, render
from tests.k8s.kuberay_sim import pod_labels
from tests.k8s.netpol_sim import (
    Ingress,
    PodRef,
    PolicyTranslationError,
    ingress_for,
    nft_ruleset,
    peer_ips,
    selector_matches,
)

pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

FIXTURES = Path(__file__).with_name("fixtures")
NS = "ml"
CPU_WORKERS = [{"name": "cpu", "accelerator": "cpu", "gpuResource": "nvidia.com/gpu", "replicas": 1,
                "terminationGracePeriodSeconds": 120, "rayStartParams": {},
                "resources": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}]


CPU_CONFIG = {"trainer": {"num_gpus": 0}, "generation": {"num_gpus": 0}}


def _policy(values: dict[str, Any] | None = None, name: str = "np") -> dict[str, Any]:
    values = {**BASE_VALUES, "config": CPU_CONFIG, **(values or {})}
    (policy,) = by_kind(objects(render(values, name=name, namespace=NS)), "NetworkPolicy")
    policy["metadata"]["namespace"] = NS
    return policy


def _old_policy() -> dict[str, Any]:
    policy = yaml.safe_load((FIXTURES / "networkpolicy-before-fix.yaml").read_text())
    policy["metadata"]["namespace"] = NS
    return policy


def _pods() -> list[PodRef]:
    """The release's pods as KubeRay labels them, plus pods the policy must keep out."""
    values = {**BASE_VALUES, "config": CPU_CONFIG, "workerGroups": CPU_WORKERS}
    (job,) = by_kind(objects(render(values, name="np", namespace=NS)), "RayJob")
    head, worker, submitter = pod_templates(job)
    return [
        PodRef("head", NS, pod_labels(head["metadata"]["labels"], "head", "np-sc-app-x", "headgroup"), "10.0.0.2"),
        PodRef("worker", NS, pod_labels(worker["metadata"]["labels"], "worker", "np-sc-app-x", "cpu"), "10.0.0.3"),
        PodRef("submitter", NS, submitter["metadata"]["labels"], "10.0.0.4"),
        PodRef("operator", "kuberay-system", {"app.kubernetes.io/name": "kuberay-operator"}, "10.0.0.5"),
        PodRef("prometheus", "monitoring", {"app.kubernetes.io/name": "prometheus"}, "10.0.0.6"),
        PodRef("neighbour", NS, {"app": "other"}, "10.0.0.7"),
        PodRef("stranger", "other", {"app.kubernetes.io/name": "sc-app", "app.kubernetes.io/instance": "np"},
               "10.0.0.8"),
    ]


def _ingress(policy: dict[str, Any], dest: str) -> Ingress:
    pods = _pods()
    (pod,) = [p for p in pods if p.name == dest]
    return ingress_for(pod, [policy], pods)


def test_release_pods_reach_each_other_on_every_port_and_protocol() -> None:
    policy = _policy({"workerGroups": CPU_WORKERS})
    selector = policy["spec"]["podSelector"]
    own = policy["spec"]["ingress"][0]
    assert own == {"from": [{"podSelector": selector}]}, "no `ports`: every port and protocol"
    release = [p for p in _pods() if p.name in ("head", "worker", "submitter")]
    for pod in release:  # every pod of the release, labelled the way KubeRay labels it, is selected and admitted
        assert selector_matches(selector, pod.labels), pod.name
    for dest in ("head", "worker"):
        ingress = _ingress(policy, dest)
        for src in release:
            for proto, port in [("tcp", 6379), ("tcp", 50089), ("tcp", 29500), ("udp", 4791), ("sctp", 1)]:
                assert ingress.admits(src.ip, proto, port), (src.name, dest, proto, port)


@pytest.mark.parametrize("monitoring", ["", "monitoring"])
def test_outside_world_gets_the_dashboard_and_metrics_only(monitoring: str) -> None:
    bastion = {"podSelector": {"matchLabels": {"app": "bastion"}}}
    policy = _policy({"networkPolicy": {"monitoringNamespace": monitoring, "extraDashboardPeers": [bastion]}})
    rules = policy["spec"]["ingress"]
    assert len(rules) == (3 if monitoring else 2)
    assert rules[1] == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                        "kuberay-system"}}}, bastion],
                        "ports": [{"protocol": "TCP", "port": 8265}]}
    if monitoring:
        assert rules[2] == {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name":
                                                                            "monitoring"}}}],
                            "ports": [{"protocol": "TCP", "port": 8080}]}
    pods = {p.name: p for p in _pods()}
    for dest in ("head", "worker"):
        ingress = _ingress(policy, dest)
        for port in (6379, 8265, 8080, 10002, 50089):
            assert ingress.admits(pods["operator"].ip, "tcp", port) == (port == 8265), (dest, port)
            assert ingress.admits(pods["prometheus"].ip, "tcp", port) == (bool(monitoring) and port == 8080)
            assert not ingress.admits(pods["neighbour"].ip, "tcp", port), "same namespace, another app"
            assert not ingress.admits(pods["stranger"].ip, "tcp", port), "release labels in another namespace"


def test_monitoring_namespace_must_be_a_namespace_name() -> None:
    with pytest.raises(Exception, match="monitoringNamespace"):
        _policy({"networkPolicy": {"monitoringNamespace": "Not_A_Namespace"}})


def test_pre_fix_policy_fixture_still_selects_todays_pods_and_blocks_unpinned_ports() -> None:
    """The fixture is what the old template rendered; it must select the pods the chart renders today, or the
    enforced comparison in test_netpol_enforced.py would compare different pods."""
    old, new = _old_policy(), _policy()
    assert old["spec"]["podSelector"] == new["spec"]["podSelector"]
    head = _pods()[0]
    worker = _ingress(old, "worker")
    assert worker.admits(head.ip, "tcp", 6379) and worker.admits(head.ip, "tcp", 10999)
    assert not worker.admits(head.ip, "tcp", 50089), "an ephemeral port (TransferQueue ZMQ, gloo) was blocked"


# --- netpol_sim semantics (NetworkPolicy API reference) --------------------------------------------------------------
def _pol(spec: dict[str, Any], ns: str = NS) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": ns}, "spec": spec}


def test_selector_semantics() -> None:
    labels = {"a": "1", "b": "2"}
    assert selector_matches({}, labels) and selector_matches(None, labels)
    assert selector_matches({"matchLabels": {"a": "1"}}, labels)
    assert not selector_matches({"matchLabels": {"a": "2"}}, labels)
    exprs = [({"key": "a", "operator": "In", "values": ["1", "3"]}, True),
             ({"key": "a", "operator": "NotIn", "values": ["1"]}, False),
             ({"key": "c", "operator": "NotIn", "values": ["1"]}, True),
             ({"key": "b", "operator": "Exists"}, True),
             ({"key": "b", "operator": "DoesNotExist"}, False)]
    for expr, expected in exprs:
        assert selector_matches({"matchExpressions": [expr]}, labels) is expected, expr
    with pytest.raises(PolicyTranslationError, match="operator"):
        selector_matches({"matchExpressions": [{"key": "a", "operator": "Gt"}]}, labels)


def test_peer_resolution() -> None:
    pods = [PodRef("x", "ml", {"r": "a"}, "10.0.0.2"), PodRef("y", "ops", {"r": "a"}, "10.0.0.3"),
            PodRef("z", "ops", {"r": "b"}, "10.0.0.4")]
    ops = {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}
    assert peer_ips({"podSelector": {"matchLabels": {"r": "a"}}}, "ml", pods) == {"10.0.0.2"}, "own namespace only"
    assert peer_ips({"namespaceSelector": ops}, "ml", pods) == {"10.0.0.3", "10.0.0.4"}
    assert peer_ips({"namespaceSelector": ops, "podSelector": {"matchLabels": {"r": "b"}}}, "ml", pods) == {
        "10.0.0.4"}
    assert peer_ips({"namespaceSelector": {}}, "ml", pods) == {"10.0.0.2", "10.0.0.3", "10.0.0.4"}
    block = {"ipBlock": {"cidr": "10.0.0.0/30", "except": ["10.0.0.3/32"]}}
    assert peer_ips(block, "ml", pods) == {"10.0.0.2"}


def test_ports_ranges_named_ports_and_isolation() -> None:
    dest = PodRef("d", NS, {"app": "d"}, "10.0.0.9", {"metrics": ("tcp", 8080)})
    src = PodRef("s", NS, {"app": "s"}, "10.0.0.2")
    other = PodRef("o", NS, {"app": "o"}, "10.0.0.3")
    pods = [dest, src, other]
    peer = [{"podSelector": {"matchLabels": {"app": "s"}}}]
    policy = _pol({"podSelector": {"matchLabels": {"app": "d"}}, "ingress": [
        {"from": peer, "ports": [{"port": 10, "endPort": 20}, {"protocol": "UDP", "port": 53},
                                 {"port": "metrics"}, {"port": "absent"}]}]})
    ingress = ingress_for(dest, [policy], pods)
    assert ingress.isolated
    assert [ingress.admits(src.ip, "tcp", p) for p in (9, 10, 20, 21, 53, 8080)] == [
        False, True, True, False, False, True]
    assert ingress.admits(src.ip, "udp", 53) and not ingress.admits(other.ip, "tcp", 15)
    assert not ingress_for(src, [policy], pods).isolated, "a pod no policy selects admits everything"
    assert ingress_for(src, [policy], pods).admits(other.ip, "tcp", 1)
    deny_all = ingress_for(dest, [_pol({"podSelector": {}, "policyTypes": ["Ingress"]})], pods)
    assert deny_all.isolated and not deny_all.admits(src.ip, "tcp", 10)
    rules = nft_ruleset(ingress)
    assert "th dport 10-20 accept" in rules and "meta l4proto udp th dport 53 accept" in rules
    assert "th dport 8080 accept" in rules
    with pytest.raises(PolicyTranslationError, match="egress"):
        ingress_for(dest, [_pol({"podSelector": {}, "policyTypes": ["Egress"]})], pods)
