"""The chart's second KubeRay pass (issue 19): head placement, the API server's proxy through the NetworkPolicy, the
optional egress policy, a read-only root file system, and the combinations KubeRay or the cluster would reject (or
that are unsafe) refused at render with one line. Rendered by the real Helm engine; objects validated strictly.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tests.k8s.k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    KUBERAY_VERSIONS,
    by_kind,
    cluster_spec,
    load_values,
    objects,
    pod_templates,
    render,
    validate_core_object,
    validate_crd_object,
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")


def merged(*overs: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(BASE_VALUES)
    for over in overs:
        _merge(out, copy.deepcopy(over))
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v
    return base


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
