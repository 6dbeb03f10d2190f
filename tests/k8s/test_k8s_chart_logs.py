"""Ray's logs that outlive a retry (issue 27 part 4): extra containers per pod group sharing the Ray log volume, the
Fluent Bit example, ``logs.toStderr``; and the render-time refusals for extra containers. Rendered by the real Helm
engine; every ci/ values file is also validated against Kubernetes' schemas and the CRDs in test_k8s_chart.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.k8s.k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    by_kind,
    load_values,
    merged_values,
    objects,
    pod_templates,
    render,
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
SIDECAR = {"name": "shipper", "image": "example/shipper:1", "volumeMounts": [
    {"name": "ray-tmp", "mountPath": "/tmp/ray", "readOnly": True}]}


def ray_templates(values: dict[str, Any]) -> list[dict[str, Any]]:
    (job,) = by_kind(objects(render(values)), "RayJob")
    return pod_templates(job)[:-1]  # head + workers (the submitter is not a Ray pod)


def refused(override: dict[str, Any]) -> str:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, override))
    return str(info.value)


def test_the_fluent_bit_example_tails_the_ray_log_volume_in_every_ray_pod() -> None:
    for template in ray_templates(load_values(CHART_DIR / "ci" / "fluent-bit-values.yaml")):
        ray, *extra = template["spec"]["containers"]
        assert ray["name"] in ("ray-head", "ray-worker"), "KubeRay takes the first container as Ray's"
        (bit,) = extra
        assert {"name": "ray-tmp", "mountPath": "/tmp/ray", "readOnly": True} in bit["volumeMounts"]
        assert {"name": "ray-tmp", "mountPath": "/tmp/ray"} in ray["volumeMounts"]
        assert bit["securityContext"]["allowPrivilegeEscalation"] is False
        assert bit["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        volumes = {v["name"] for v in template["spec"]["volumes"]}
        assert {"ray-tmp", "fluentbit-config"} <= volumes


def test_extra_containers_per_group_land_only_in_that_group() -> None:
    values = merged_values(BASE_VALUES, {"head": {"extraContainers": [SIDECAR]}})
    head, *workers = ray_templates(values)
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head", "shipper"]
    assert workers and all([c["name"] for c in w["spec"]["containers"]] == ["ray-worker"] for w in workers)


def test_a_groups_own_security_keys_win_and_the_rest_is_filled_in() -> None:
    base = merged_values(BASE_VALUES)
    groups = load_values(CHART_DIR / "values.yaml")["workerGroups"]
    groups[0]["extraContainers"] = [{**SIDECAR, "securityContext": {"runAsUser": 20000}}]
    base["workerGroups"] = groups
    head, worker = ray_templates(base)
    (sidecar,) = [c for c in worker["spec"]["containers"] if c["name"] == "shipper"]
    assert sidecar["securityContext"]["runAsUser"] == 20000
    assert sidecar["securityContext"]["allowPrivilegeEscalation"] is False
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head"]


@pytest.mark.parametrize(("on", "expected"), [(True, [{"name": "RAY_LOG_TO_STDERR", "value": "1"}]), (False, [])])
def test_logs_to_stderr_sets_rays_switch_on_every_ray_container(on: bool, expected: list[dict[str, str]]) -> None:
    for template in ray_templates(merged_values(BASE_VALUES, {"logs": {"toStderr": on}})):
        env = template["spec"]["containers"][0].get("env") or []
        assert [e for e in env if e["name"] == "RAY_LOG_TO_STDERR"] == expected


@pytest.mark.parametrize(("override", "message"), [
    pytest.param({"extraContainers": [{**SIDECAR, "name": "ray-worker"}]},
                 r"extraContainers name \"ray-worker\" appears twice in the workerGroups\[0\] \(gpu\) pod",
                 id="shadows-ray"),
    pytest.param({"extraContainers": [SIDECAR], "head": {"extraContainers": [SIDECAR]}},
                 r"extraContainers name \"shipper\" appears twice in the head pod", id="twice"),
    pytest.param({"extraContainers": [{**SIDECAR, "volumeMounts": [{"name": "logs", "mountPath": "/l"}]}]},
                 r"extraContainers \"shipper\" mounts volume \"logs\", which the head pod does not have",
                 id="unknown-volume"),
    pytest.param({"extraContainers": [{**SIDECAR, "securityContext": {"privileged": True}}]},
                 r"extraContainers \"shipper\" in the head pod asks for privileges", id="privileged"),
    pytest.param({"extraContainers": [{"name": "x"}]}, r"extraContainers/0", id="no-image"),
    pytest.param({"logs": {"toStderr": "yes"}}, r"/logs/toStderr", id="stderr-not-bool"),
])
def test_extra_containers_the_cluster_would_refuse_are_refused_at_render(override: dict[str, Any],
                                                                         message: str) -> None:
    text = refused(override)
    assert re.search(message, text), text


def test_a_privileged_sidecar_is_allowed_where_the_namespace_is_privileged() -> None:
    values = merged_values(BASE_VALUES, {"podSecurityStandard": "privileged",
                                         "extraContainers": [{**SIDECAR, "securityContext": {"privileged": True}}]})
    assert all(t["spec"]["containers"][1]["securityContext"]["privileged"] for t in ray_templates(values))
