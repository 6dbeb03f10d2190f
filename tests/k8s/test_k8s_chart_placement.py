"""Per-role placement in the chart (workerGroups[].roles, placement.sameZone, topologySpread, podDisruptionBudget),
rendered by the real Helm engine: the roles' custom Ray resources on the groups and in the mounted config, checked
by packing the config's own actors (sc_app.attempt.cluster_fit) onto the pods the chart renders; combinations that
cannot work refused at render in one line. What only a live cluster proves (Ray advertising the group's resources,
the scheduler honouring the affinity) is ops/cluster-smoke.sh's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sc_app.attempt.cluster_fit import job_demands, missing
from sc_app.config.app import load_config
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
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

MULTINODE = load_values(CHART_DIR / "ci" / "multinode-gpu-values.yaml")
SELECTOR = {"app.kubernetes.io/name": "sc-app", "app.kubernetes.io/instance": "demo"}


def _rendered(values: dict[str, Any], tmp_path: Path):
    objs = objects(render(values))
    (job,) = by_kind(objs, "RayJob")
    (cm,) = by_kind(objs, "ConfigMap")
    (tmp_path / "config.yaml").write_text(cm["data"]["config.yaml"])
    return objs, job, load_config(tmp_path / "config.yaml")


def _cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if str(quantity).endswith("m") else float(quantity)


def _nodes(job: dict[str, Any], skip: str = "") -> list[dict[str, float]]:
    """Each pod the RayJob asks for as the Ray node it becomes: its CPU and GPU limits and its group's resources."""
    spec = job["spec"]["rayClusterSpec"]
    head_limits = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    nodes = [{"CPU": _cpus(head_limits["cpu"])}]
    for group in spec["workerGroupSpecs"]:
        if group["groupName"] == skip:
            continue
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        node = {"CPU": _cpus(limits["cpu"]), "GPU": float(limits.get("nvidia.com/gpu", 0))}
        node.update({k: float(v) for k, v in (group.get("resources") or {}).items()})
        nodes += [dict(node) for _ in range(group["replicas"])]
    return nodes


def test_multinode_roles_land_each_actor_on_its_groups_only(tmp_path: Path) -> None:
    _, job, cfg = _rendered(MULTINODE, tmp_path)
    groups = {g["groupName"]: g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]}
    assert {n: g.get("resources") for n, g in groups.items()} == {
        "trainer": {"sc_app_trainer": "1000"}, "generation": {"sc_app_generation": "1000"},
        "data-plane": {"sc_app_data_plane": "1000"}}  # fmt: skip
    assert "resources" not in groups["trainer"]["rayStartParams"]
    assert cfg.trainer.resources == {"sc_app_trainer": 1.0} and cfg.generation.resources == {"sc_app_generation": 1.0}
    assert cfg.data_plane.storage_node_resource == "sc_app_data_plane"
    demands = job_demands(cfg)
    assert missing(demands, _nodes(job)) == [], "the job fits the pods the chart renders"
    # Without the trainer nodes no rank fits, though the generation nodes have 16 free GPUs: roles pin them.
    left = {d.name.rsplit(" ", 1)[0] for d in missing(demands, _nodes(job, skip="trainer"))}
    assert left == {"trainer rank"}
    left = {d.name.rsplit(" ", 1)[0] for d in missing(demands, _nodes(job, skip="data-plane"))}
    assert left == {"storage unit"}


def test_multinode_same_zone_spread_and_disruption_budget(tmp_path: Path) -> None:
    objs, job, _ = _rendered(MULTINODE, tmp_path)
    zone_term = {"labelSelector": {"matchLabels": SELECTOR}, "topologyKey": "topology.kubernetes.io/zone"}
    for template in pod_templates(job)[:4]:  # head and every worker group (not KubeRay's submitter)
        terms = template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == [zone_term]
        assert template["metadata"]["labels"].items() >= SELECTOR.items(), "every pod matches the zone term"
    trainer = pod_templates(job)[1]
    (spread,) = trainer["spec"]["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == {**SELECTOR, "sc-app/role": "worker",
                                                      "sc-app/worker-group": "trainer"}  # fmt: skip
    assert spread["labelSelector"]["matchLabels"].items() <= trainer["metadata"]["labels"].items()
    (pdb,) = by_kind(objs, "PodDisruptionBudget")
    validate_core_object(pdb)
    assert pdb["spec"] == {"maxUnavailable": 0, "selector": {"matchLabels": SELECTOR}}


def test_sameZone_merges_with_a_groups_own_pod_affinity() -> None:
    own = {"labelSelector": {"matchLabels": {"team": "rl"}}, "topologyKey": "kubernetes.io/hostname"}
    groups = [{**MULTINODE["workerGroups"][0], "affinity": {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [own]}}}, *MULTINODE["workerGroups"][1:]]  # fmt: skip
    (job,) = by_kind(objects(render({**MULTINODE, "workerGroups": groups})), "RayJob")
    terms = pod_templates(job)[1]["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms[0] == own and terms[1]["topologyKey"] == "topology.kubernetes.io/zone"


def test_without_roles_nothing_changes(tmp_path: Path) -> None:
    objs, job, cfg = _rendered(BASE_VALUES, tmp_path)
    assert all("resources" not in g for g in job["spec"]["rayClusterSpec"]["workerGroupSpecs"])
    assert cfg.trainer.resources == {} and cfg.data_plane.storage_node_resource is None
    assert not by_kind(objs, "PodDisruptionBudget")
    assert all("topologySpreadConstraints" not in t["spec"] for t in pod_templates(job))


def _group(of: str, **over: Any) -> dict[str, Any]:
    return {**next(g for g in MULTINODE["workerGroups"] if g["name"] == of), **over}


BAD = [
    pytest.param({"workerGroups": [_group("trainer", replicas=1), _group("generation", replicas=3),
                                   _group("data-plane")]},
                 r"config\.trainer: 16 workers \(spare ranks included\) x num_gpus=1 fit only 8 times on the groups "
                 r"with role trainer \(trainer: replicas x GPUs per pod\); its actors can land nowhere else",
                 id="role-gpus-short"),
    pytest.param({"config": {"trainer": {"spare_ranks": 1}},  # 33 GPUs asked of 40: only the trainer role is short
                  "workerGroups": [_group("trainer"), _group("generation", replicas=3), _group("data-plane")]},
                 r"config\.trainer: 17 workers \(spare ranks included\) x num_gpus=1 fit only 16 times",
                 id="role-gpus-short-of-a-spare"),
    pytest.param({"workerGroups": [*MULTINODE["workerGroups"], _group("data-plane", name="spare", replicas=0,
                                                                       roles=["data_plane", "trainer"])]},
                 r"workerGroups\[3\] \(spare\) hosts roles \[data_plane trainer\] with replicas=0",
                 id="role-no-pods"),
    pytest.param({"workerGroups": [_group("trainer", rayStartParams={"resources": '{"x": 1}'}), _group("generation"),
                                   _group("data-plane")]},
                 r"workerGroups\[0\] \(trainer\) sets rayStartParams\.resources and roles", id="both-resources"),
    pytest.param({"config": {"data_plane": {"storage_node_resource": "tq_node"}}},
                 r"config\.data_plane\.storage_node_resource=tq_node but a worker group has role data_plane",
                 id="storage-resource-conflict"),
    pytest.param({"podDisruptionBudget": {"minAvailable": 3}}, r"podDisruptionBudget: set minAvailable or "
                 r"maxUnavailable, not both", id="pdb-both"),
    pytest.param({"workerGroups": [_group("trainer", roles=["parameter_server"])]}, r"/workerGroups/0/roles/0",
                 id="unknown-role"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "message"), BAD)
def test_combinations_that_cannot_work_are_refused_in_one_line(override: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(MULTINODE, override))
    text = str(info.value)
    assert re.search(message, text), text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 4


def test_the_example_is_documented() -> None:
    doc = (CHART_DIR.parent.parent / "docs" / "kubernetes-placement.md").read_text()
    assert "ci/multinode-gpu-values.yaml" in doc and "sc_app_trainer" in doc
    assert yaml.safe_load((CHART_DIR / "ci" / "multinode-gpu-values.yaml").read_text())["placement"]["sameZone"]
