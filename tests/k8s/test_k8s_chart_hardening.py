"""The chart's second KubeRay pass (issue 19): head placement, the API server's proxy through the NetworkPolicy, the
optional egress policy, a read-only root file system, and the combinations KubeRay or the cluster would reject (or
that are unsafe) refused at render with one line. Rendered by the real Helm engine; objects validated strictly.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.k8s.k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    KUBERAY_VERSIONS,
    by_kind,
    load_values,
    merged_values,
    objects,
    pod_templates,
    render,
    validate_core_object,
    validate_crd_object,
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")


def merged(*overs: dict[str, Any]) -> dict[str, Any]:
    return merged_values(BASE_VALUES, *overs)


def _job(values: dict[str, Any]) -> dict[str, Any]:
    (job,) = by_kind(objects(render(values)), "RayJob")
    return job


def _valid(objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        if obj["apiVersion"] == "ray.io/v1":
            for kuberay in KUBERAY_VERSIONS:
                validate_crd_object(obj, kuberay)
        elif obj["apiVersion"] != "monitoring.coreos.com/v1":
            validate_core_object(obj)


# ---------------------------------------------------------------------------------------------- head placement
def test_on_demand_head_example_keeps_only_the_head_off_spot_nodes() -> None:
    values = load_values(CHART_DIR / "ci" / "on-demand-head-values.yaml")
    job = _job(values)
    head, *workers = pod_templates(job)[:1 + len(values["workerGroups"])]
    terms = head["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    keys = {e["key"] for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]}
    assert {"eks.amazonaws.com/capacityType", "karpenter.sh/capacity-type", "cloud.google.com/gke-spot",
            "kubernetes.azure.com/scalesetpriority"} <= keys
    assert all("affinity" not in w["spec"] for w in workers), "spot is fine for workers"
    assert {"key": "sc-app/pool", "operator": "Equal", "value": "head", "effect": "NoSchedule"} in head["spec"][
        "tolerations"]


# ---------------------------------------------------------------------------------------------- refusals
_RULE = {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}}
_RULES_OFF = {"shutdownAfterJobFinishes": False}
_MEM = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}

REFUSED = [
    pytest.param({"rayAuth": {"enabled": False}, "networkPolicy": {"enabled": False}},
                 r"rayAuth\.enabled=false with networkPolicy\.enabled=false: any pod in the cluster could submit code "
                 r".*rayAuth\.acceptOpenCluster=true", id="open-cluster"),
    pytest.param({"job": {"submissionMode": "SidecarMode"}},
                 r"SidecarMode with podSecurityStandard=restricted: KubeRay adds its submitter container to the head "
                 r"pod without a securityContext", id="sidecar-vs-restricted"),
    pytest.param({"job": {**_RULES_OFF, "deletionRules": [_RULE, {**_RULE, "condition": {**_RULE["condition"],
                                                                                         "ttlSeconds": 90}}]}},
                 r"job\.deletionRules\[1\] repeats job\.deletionRules\[0\] \(DeleteCluster on jobStatus SUCCEEDED\)",
                 id="duplicate-deletion-rule"),
    pytest.param({"job": {**_RULES_OFF, "deletionRules": [
        {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 600}},
        {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 60}}]}},
                 r"on jobStatus FAILED: DeleteCluster ttlSeconds \(60\) is below DeleteWorkers ttlSeconds \(600\); "
                 r"KubeRay requires DeleteWorkers <= DeleteCluster <= DeleteSelf", id="deletion-ttl-order"),
    pytest.param({"metrics": {"podMonitor": {"enabled": True}}},
                 r"podMonitor\.enabled without networkPolicy\.monitoringNamespace: the NetworkPolicy would drop every "
                 r"scrape", id="podmonitor-without-namespace"),
    pytest.param({"head": {"shmSize": "32Gi", "resources": _MEM}},
                 r"head\.shmSize 32Gi is above its memory limit 16Gi", id="head-shm-over-limit"),
    pytest.param({"workerGroups": [{"name": "gpu", "accelerator": "gpu", "gpuResource": "nvidia.com/gpu",
                                    "replicas": 2, "shmSize": "70000M", "terminationGracePeriodSeconds": 120,
                                    "resources": {"limits": {"memory": "64Gi", "nvidia.com/gpu": 1}}}]},
                 r"workerGroups\[0\] \(gpu\)\.shmSize 70000M is above its memory limit 64Gi", id="worker-shm-over"),
    pytest.param({"scratch": {"ephemeralStorage": {"request": "100Gi"}}},
                 r"scratch\.ephemeralStorage\.request 100Gi is above its limit 50Gi", id="ephemeral-request-over"),
]


@pytest.mark.parametrize(("override", "message"), REFUSED)
def test_unsafe_or_rejected_combinations_are_refused_in_one_line(override: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged(override))
    text = str(info.value)
    assert re.search(message, text), text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 2


@pytest.mark.parametrize("override", [
    pytest.param({"rayAuth": {"enabled": False, "acceptOpenCluster": True}, "networkPolicy": {"enabled": False}},
                 id="open-cluster-accepted"),
    pytest.param({"rayAuth": {"enabled": False}}, id="auth-off-policy-on"),
    pytest.param({"job": {"submissionMode": "SidecarMode"}, "podSecurityStandard": "baseline"}, id="sidecar-baseline"),
    pytest.param({"job": {**_RULES_OFF, "deletionRules": [
        _RULE, {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
        {"policy": "DeleteWorkers", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}},
        {"policy": "DeleteSelf", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 3600}}]}},
                 id="deletion-rules-in-order"),
    pytest.param({"metrics": {"podMonitor": {"enabled": True}}, "networkPolicy": {"enabled": False}},
                 id="podmonitor-without-policy"),
    pytest.param({"head": {"shmSize": "16Gi", "resources": _MEM}}, id="shm-equal-to-limit"),
    pytest.param({"head": {"shmSize": "15000Mi", "resources": _MEM}}, id="shm-below-limit"),
    pytest.param({"scratch": {"ephemeralStorage": {"request": "50Gi", "limit": ""}}}, id="ephemeral-no-limit"),
])
def test_neighbours_of_the_refusals_render_valid_objects(override: dict[str, Any]) -> None:
    _valid(objects(render(merged(override))))


@pytest.mark.parametrize(("release", "ok"), [("1st", False), ("Grpo", False), ("grpo-1", True), ("a", True)])
def test_release_names_kuberay_refuses_are_refused_at_render(release: str, ok: bool) -> None:
    if ok:
        _valid(objects(render(merged(), name=release)))
        return
    with pytest.raises(helm_python.HelmError, match=r"not a DNS-1035 label.*starts with a letter"):
        render(merged(), name=release)


# ---------------------------------------------------------------------------------------------- network policy
def _policy(values: dict[str, Any]) -> dict[str, Any]:
    (policy,) = by_kind(objects(render(merged(values))), "NetworkPolicy")
    policy["metadata"]["namespace"] = "ml"
    validate_core_object(policy)
    return policy


def test_api_server_proxy_reaches_the_dashboard_port_only_from_the_control_plane_cidr() -> None:
    from tests.k8s.netpol_sim import PodRef, ingress_for

    head = PodRef("head", "ml", {"app.kubernetes.io/name": "sc-app", "app.kubernetes.io/instance": "demo"},
                  "10.0.0.2")
    apiserver = PodRef("apiserver", "", {}, "172.16.0.10")  # the proxy's source: a control-plane address
    stranger = PodRef("stranger", "", {}, "192.168.7.7")
    pods = [head, apiserver, stranger]
    closed = ingress_for(head, [_policy({})], pods)
    assert not closed.admits(apiserver.ip, "tcp", 8265), "without apiServerCIDRs the proxy is dropped"
    opened = ingress_for(head, [_policy({"networkPolicy": {"apiServerCIDRs": ["172.16.0.0/28"]}})], pods)
    assert opened.admits(apiserver.ip, "tcp", 8265)
    assert not opened.admits(apiserver.ip, "tcp", 6379), "the dashboard port only"
    assert not opened.admits(stranger.ip, "tcp", 8265)


def test_optional_egress_policy_allows_dns_own_pods_api_server_and_storage_only() -> None:
    policy = _policy({"networkPolicy": {"apiServerCIDRs": ["172.16.0.0/28"],
                                        "egress": {"enabled": True, "storageCIDRs": ["10.9.0.0/16"]}}})
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    dns, own, api, storage = policy["spec"]["egress"]
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert own == {"to": [{"podSelector": policy["spec"]["podSelector"]}]}, "every port to the release's pods"
    assert api == {"to": [{"ipBlock": {"cidr": "172.16.0.0/28"}}],
                   "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}
    assert storage == {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}]}
    assert "egress" not in _policy({})["spec"] and _policy({})["spec"]["policyTypes"] == ["Ingress"]


# ---------------------------------------------------------------------------------------------- hardening
def test_read_only_root_filesystem_gives_every_container_writable_scratch() -> None:
    """On by default (tests/k8s/test_prestop_kubelet.py runs the job, the preStop hook and the retry so): every
    container of every pod has a read-only root, /tmp and $HOME as emptyDirs, and the Ray containers an
    ephemeral-storage request and limit; a group that names its own ephemeral-storage keeps it."""
    from tests.k8s.test_k8s_runbooks import restricted_violations

    job = _job(merged({"scratch": {"raySizeLimit": "50Gi"}}))
    _valid([job])
    for template in pod_templates(job):
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["tmp"]["emptyDir"] == {"sizeLimit": "10Gi"} and "home" in volumes
        for c in spec["containers"] + spec.get("initContainers", []):
            assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["name"]
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert {"/tmp", "/home/scapp"} <= mounts, c["name"]
        assert restricted_violations({"spec": spec}) == []
    head, worker = (t["spec"]["containers"][0]["resources"] for t in pod_templates(job)[:2])
    for res in (head, worker):
        assert res["requests"]["ephemeral-storage"] == "10Gi" and res["limits"]["ephemeral-storage"] == "50Gi"
    assert {v["name"]: v for v in pod_templates(job)[0]["spec"]["volumes"]}["ray-tmp"]["emptyDir"] == {
        "sizeLimit": "50Gi"}
    own = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi",
                                                                     "ephemeral-storage": "200Gi"}}
    kept = pod_templates(_job(merged({"head": {"resources": own}})))[0]["spec"]["containers"][0]["resources"]
    assert kept["limits"]["ephemeral-storage"] == "200Gi" and "ephemeral-storage" not in kept["requests"]
    # Off: no extra volumes, root file system as the image has it.
    plain = pod_templates(_job(merged({"scratch": {"readOnlyRootFilesystem": False}})))[0]["spec"]
    assert {v["name"] for v in plain["volumes"]}.isdisjoint({"tmp", "home"})
    assert "readOnlyRootFilesystem" not in plain["containers"][0]["securityContext"]


def test_finished_clusters_do_not_hold_gpus_for_ten_minutes() -> None:
    assert _job(merged())["spec"]["ttlSecondsAfterFinished"] == 60
