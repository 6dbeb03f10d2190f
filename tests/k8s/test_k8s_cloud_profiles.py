"""Per-cloud profiles (issue 27 part 5): ci/gke-values.yaml, ci/eks-values.yaml, ci/aks-values.yaml rendered by the
real Helm engine and checked for what each cloud needs; the NetworkPolicy they render is evaluated as a packet filter
by netpol_sim (the konnectivity agents reach the dashboard port and nothing else). Every ci/ file is also validated
against Kubernetes' schemas and the CRDs in test_k8s_chart.py."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest

from sc_app.k8s.live import policy_blocking_proxy
from tests.k8s.k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    by_kind,
    load_values,
    merged_values,
    objects,
    pod_templates,
    render,
    validate_core_object,
    validate_crd_object,
)
from tests.k8s.kuberay_sim import pod_labels
from tests.k8s.netpol_sim import PodRef, ingress_for, selector_matches

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
NS = "ml"


def profile(cloud: str) -> list[dict[str, Any]]:
    objs = objects(render(load_values(CHART_DIR / "ci" / f"{cloud}-values.yaml"), name="demo", namespace=NS))
    for obj in objs:
        obj["metadata"]["namespace"] = NS
    return objs


def the(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = by_kind(objs, kind)
    return obj


def ray_pods(objs: list[dict[str, Any]]) -> list[PodRef]:
    """The head and each worker group's pod as KubeRay labels them."""
    head, *workers = pod_templates(the(objs, "RayJob"))[:-1]
    out = [PodRef("head", NS, pod_labels(head["metadata"]["labels"], "head", "demo-x", "headgroup"), "10.0.0.2")]
    out += [PodRef(f"worker{i}", NS, pod_labels(w["metadata"]["labels"], "worker", "demo-x", "gpu"), f"10.0.0.{3 + i}")
            for i, w in enumerate(workers)]
    return out


@pytest.mark.parametrize(("cloud", "labels"), [("gke", {"k8s-app": "konnectivity-agent"}),
                                               ("aks", {"app": "konnectivity-agent"})])
def test_the_konnectivity_agents_reach_the_dashboard_and_nothing_else(cloud: str, labels: dict[str, str]) -> None:
    objs = profile(cloud)
    policy = the(objs, "NetworkPolicy")
    pods = [*ray_pods(objs), PodRef("konnectivity", "kube-system", labels, "10.1.0.9"),
            PodRef("coredns", "kube-system", {"k8s-app": "kube-dns"}, "10.1.0.10")]
    ingress = copy.deepcopy(policy)  # netpol_sim filters ingress only; the egress half is checked below
    ingress["spec"].pop("egress", None)
    ingress["spec"]["policyTypes"] = ["Ingress"]
    head = ingress_for(pods[0], [ingress], pods)
    assert head.admits("10.1.0.9", "tcp", 8265)
    assert not head.admits("10.1.0.9", "tcp", 6379) and not head.admits("10.1.0.10", "tcp", 8265)
    job = the(objs, "RayJob")
    assert policy_blocking_proxy(_Policies([policy]), job, "8265") is None, "status would blame this policy"


class _Policies:
    """The two calls policy_blocking_proxy makes of a Kube."""

    def __init__(self, policies: list[dict[str, Any]]) -> None:
        self.policies = policies

    def resource(self, *_: str) -> str:
        return "networkpolicies"

    def list(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
        return copy.deepcopy(self.policies)


def test_gke_resolves_through_nodelocal_dns_and_cloud_dns() -> None:
    policy = the(profile("gke"), "NetworkPolicy")
    (dns,) = [r for r in policy["spec"]["egress"] if {"protocol": "UDP", "port": 53} in r.get("ports", [])]
    blocks = [p["ipBlock"]["cidr"] for p in dns["to"] if "ipBlock" in p]
    assert blocks == ["169.254.20.10/32", "169.254.169.254/32"]
    assert dns["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}], "DNS only"
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}} in dns["to"]
    validate_core_object(policy)


def test_gke_managed_prometheus_selects_the_ray_pods_named_metrics_port() -> None:
    objs = profile("gke")
    mon = the(objs, "PodMonitoring")
    assert mon["apiVersion"] == "monitoring.googleapis.com/v1" and not by_kind(objs, "PodMonitor")
    (endpoint,) = mon["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and re.fullmatch(r"\d+s", endpoint["interval"])
    assert set(mon["spec"]) == {"selector", "endpoints"}
    for template in pod_templates(the(objs, "RayJob"))[:-1]:
        labels = template["metadata"]["labels"]
        assert selector_matches(mon["spec"]["selector"], labels)
        assert {"name": "metrics", "containerPort": 8080} in template["spec"]["containers"][0]["ports"]
    submitter = pod_templates(the(objs, "RayJob"))[-1]
    assert not selector_matches(mon["spec"]["selector"], submitter["metadata"]["labels"])
    policy = the(objs, "NetworkPolicy")
    scrape = [r for r in policy["spec"]["ingress"] if r.get("ports") == [{"protocol": "TCP", "port": 8080}]]
    assert scrape and scrape[0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "gmp-system"}


def test_gke_spot_workers_get_the_120s_grace_and_the_head_stays_off_spot() -> None:
    objs = profile("gke")
    head, worker = pod_templates(the(objs, "RayJob"))[:-1]
    assert worker["spec"]["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert worker["spec"]["terminationGracePeriodSeconds"] == 120
    terms = head["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["operator"] == "DoesNotExist"
    config = the(objs, "ConfigMap")["data"]["config.yaml"]
    assert "preemption_notice_s: 120" in config


def test_eks_efa_hugepages_efs_and_karpenter() -> None:
    objs = profile("eks")
    assert the(objs, "PersistentVolumeClaim")["spec"]["storageClassName"] == "efs-sc"
    head, worker = pod_templates(the(objs, "RayJob"))[:-1]
    resources = worker["spec"]["containers"][0]["resources"]
    assert resources["limits"]["vpc.amazonaws.com/efa"] == resources["requests"]["vpc.amazonaws.com/efa"] == "4"
    assert resources["limits"]["hugepages-2Mi"] and resources["requests"]["memory"]
    assert worker["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert "karpenter.sh/do-not-disrupt" not in (head["metadata"].get("annotations") or {})
    validate_core_object({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": worker})
    policy = the(objs, "NetworkPolicy")
    vpc = [r for r in policy["spec"]["ingress"] if {"ipBlock": {"cidr": "10.0.0.0/16"}} in r.get("from", [])]
    assert vpc and vpc[0]["ports"] == [{"protocol": "TCP", "port": 8265}]


def test_aks_nfs_share_and_azure_managed_prometheus() -> None:
    objs = profile("aks")
    assert the(objs, "PersistentVolumeClaim")["spec"]["storageClassName"] == "azurefile-csi-nfs"
    mon = the(objs, "PodMonitor")
    assert mon["apiVersion"] == "azmonitoring.coreos.com/v1"
    # Azure's PodMonitor is the Prometheus Operator's schema under its own group.
    validate_crd_object({**mon, "apiVersion": "monitoring.coreos.com/v1"})
    scrape = [r for r in the(objs, "NetworkPolicy")["spec"]["ingress"]
              if r.get("ports") == [{"protocol": "TCP", "port": 8080}]]
    assert scrape[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "kube-system"


GPU_GROUP = {"name": "gpu", "accelerator": "gpu", "gpuResource": "nvidia.com/gpu", "replicas": 2,
             "terminationGracePeriodSeconds": 120}


@pytest.mark.parametrize(("requests", "limits", "message"), [
    pytest.param({"memory": "8Gi", "hugepages-2Mi": "5Gi"}, {"memory": "8Gi", "hugepages-2Mi": "4Gi"},
                 r"workerGroups\[0\] \(gpu\) resources\.requests\.hugepages-2Mi=5Gi differs from its limit 4Gi",
                 id="hugepages-differ"),
    pytest.param({"vpc.amazonaws.com/efa": "4"}, {},
                 r"resources\.requests\.vpc\.amazonaws\.com/efa has no limit", id="efa-without-limit"),
    pytest.param({}, {"hugepages-2Mi": "1Gi"}, r"hugepages without a cpu or memory request", id="hugepages-alone"),
])
def test_resources_kubernetes_cannot_overcommit_are_refused(requests: dict[str, str], limits: dict[str, str],
                                                            message: str) -> None:
    group = {**GPU_GROUP, "resources": {"requests": {"nvidia.com/gpu": "1", **requests},
                                        "limits": {"nvidia.com/gpu": "1", **limits}}}
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, {"workerGroups": [group]}))
    assert re.search(message, str(info.value)), str(info.value)


def test_equal_quantities_in_other_units_are_accepted() -> None:
    group = {**GPU_GROUP, "resources": {"requests": {"nvidia.com/gpu": "1", "memory": "8Gi", "hugepages-2Mi": "5Gi"},
                                        "limits": {"nvidia.com/gpu": "1", "memory": "8Gi",
                                                   "hugepages-2Mi": "5120Mi"}}}
    assert by_kind(objects(render(merged_values(BASE_VALUES, {"workerGroups": [group]}))), "RayJob")


@pytest.mark.parametrize(("override", "message"), [
    ({"networkPolicy": {"egress": {"enabled": True, "dnsCIDRs": ["169.254.20.10"]}}}, r"dnsCIDRs"),
    ({"metrics": {"podMonitor": {"enabled": True, "flavor": "datadog"}}}, r"flavor"),
])
def test_bad_cloud_values_are_refused_by_the_schema(override: dict[str, Any], message: str) -> None:
    with pytest.raises((helm_python.HelmError, jsonschema.ValidationError)) as info:
        render(merged_values(BASE_VALUES, override))
    assert re.search(message, str(info.value)), str(info.value)
