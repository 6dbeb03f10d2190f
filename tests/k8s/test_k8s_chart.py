"""The Helm chart, rendered by the real Helm engine and validated like an API server would.

Covers: default and realistic values render; every core object passes kubernetes-validate (strict); every
RayJob/RayCluster passes the KubeRay v1 CRD schemas of the chart's minimum and of the newest KubeRay (strict,
defaults applied), the PodMonitor the Prometheus Operator's; bad values, and values KubeRay/Kueue/KAI would refuse,
are refused at render with one clear line; every Ray container stops the run through its preStop hook inside its
grace period; the mounted config is one sc-app itself accepts.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.k8s.k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    CI_VALUES,
    KUBERAY_MIN,
    KUBERAY_VERSIONS,
    REPO_ROOT,
    by_kind,
    cluster_spec,
    is_custom,
    load_values,
    merged_values,
    objects,
    pod_templates,
    render,
    validate_core_object,
    validate_crd_object,
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")

MATRIX = [pytest.param(BASE_VALUES, id="defaults")] + [
    pytest.param(load_values(p), id=p.stem) for p in CI_VALUES
]


# A PodMonitor needs the namespace Prometheus scrapes from (the chart refuses it otherwise).
MONITORED = {"metrics": {"podMonitor": {"enabled": True, "flavor": "prometheus-operator"}},
             "networkPolicy": {"monitoringNamespace": "monitoring"}}


def _the(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['kind'] for o in objs]}"
    return found[0]


def _ray_object(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (obj,) = [o for o in objs if o["apiVersion"] == "ray.io/v1"]
    return obj


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _ray_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Head and worker pod templates (not the submitter)."""
    rc = cluster_spec(obj)
    return [rc["headGroupSpec"]["template"]] + [g["template"] for g in rc.get("workerGroupSpecs", [])]


@pytest.mark.parametrize("values", MATRIX)
def test_every_rendered_object_is_valid(values: dict[str, Any]) -> None:
    objs = objects(render(merged_values(values, MONITORED)))
    assert {"ConfigMap", "PodMonitor"} <= {o["kind"] for o in objs}
    for obj in objs:
        if is_custom(obj):
            for kuberay in KUBERAY_VERSIONS:  # the chart's minimum KubeRay accepts every field it renders
                validate_crd_object(obj, kuberay)
            validate_core_object({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]})
        else:
            validate_core_object(obj)
        if obj["apiVersion"] == "ray.io/v1":
            for template in pod_templates(obj):
                validate_core_object(
                    {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
                )


@pytest.mark.parametrize("values", MATRIX)
def test_helm_lint_strict_is_clean(values: dict[str, Any]) -> None:
    report = helm_python.lint(CHART_DIR, values, strict=True, kube_version="v1.31.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def test_default_rayjob_contract() -> None:
    objs = objects(render(BASE_VALUES))
    job = _the(objs, "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"] == "sc-app run --config /etc/sc-app/config.yaml"
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["backoffLimit"] >= 3, "must survive several preemptions"
    assert spec["shutdownAfterJobFinishes"] is True
    assert "activeDeadlineSeconds" not in spec
    # An attempt that cannot start gives its GPUs back; the submitter retries a bounded number of times.
    assert spec["preRunningDeadlineSeconds"] == 900
    assert spec["submitterConfig"] == {"backoffLimit": 2}
    assert "deletionStrategy" not in spec
    rc = spec["rayClusterSpec"]
    ray_pin = re.search(r'"ray\[default\]==([0-9.]+)"', (REPO_ROOT / "pyproject.toml").read_text())
    assert ray_pin, "pyproject.toml must pin ray[default]"
    assert rc["rayVersion"] == ray_pin.group(1), "chart rayVersion must equal the image's pinned ray"
    assert rc["authOptions"]["mode"] == "token"
    secret = _the(objs, "Secret")
    assert rc["authOptions"]["secretName"] == secret["metadata"]["name"]
    assert len(secret["data"]["auth_token"]) >= 40
    assert not by_kind(objs, "PodMonitor"), "the PodMonitor is opt-in"

    head = rc["headGroupSpec"]["template"]["spec"]
    (init,) = head["initContainers"]
    assert init["command"] == [
        "sc-app", "preflight", "--checkpoint-dir", "/checkpoints", "--config", "/etc/sc-app/config.yaml", "--json"
    ]
    assert init["image"] == head["containers"][0]["image"] == "ghcr.io/sc-app/sc-app:0.1.0"
    claim = _the(objs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # Same claim at the same path on the preflight, the head and every worker.
    for template in _ray_templates(job):
        vols = {v["name"]: v for v in template["spec"]["volumes"]}
        assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        for c in _containers(template):
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts["checkpoints"] == "/checkpoints", c["name"]
            assert mounts["config"] == "/etc/sc-app", c["name"]
            assert "SC_APP_CHECKPOINT_DIR" not in {e["name"] for e in c.get("env", [])}, "nothing reads it"
    # Fixed-size worker groups: no autoscaler, min = replicas = max (KubeRay requires both bounds without one).
    assert rc["enableInTreeAutoscaling"] is False
    (group,) = rc["workerGroupSpecs"]
    assert group["minReplicas"] == group["replicas"] == group["maxReplicas"] == 2
    worker = group["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["terminationGracePeriodSeconds"] == 120
    # Non-root everywhere.
    for template in pod_templates(job):
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        assert template["spec"]["securityContext"]["runAsUser"] != 0
        for c in _containers(template):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_head_and_workers_share_one_pod_template() -> None:
    """Head and worker pods differ only where the head has more (preflight, head ports), never by drift."""
    job = _the(objects(render(BASE_VALUES)), "RayJob")
    head, worker = _ray_templates(job)
    hs, ws = head["spec"], worker["spec"]
    same = {"serviceAccountName", "automountServiceAccountToken", "securityContext", "terminationGracePeriodSeconds"}
    assert {k: hs[k] for k in same} == {k: ws[k] for k in same}
    hc, wc = hs["containers"][0], ws["containers"][0]
    for key in ("image", "imagePullPolicy", "securityContext", "lifecycle"):
        assert hc[key] == wc[key], key
    assert [m["name"] for m in hc["volumeMounts"]] == [m["name"] for m in wc["volumeMounts"]]
    assert [v["name"] for v in hs["volumes"]] == [v["name"] for v in ws["volumes"]]
    assert {p["name"] for p in hc["ports"]} - {p["name"] for p in wc["ports"]} == {"gcs-server", "dashboard", "client"}
    source = (CHART_DIR / "templates" / "_raycluster.tpl").read_text()
    assert source.count("containers:") == 1 and source.count("volumes:") == 1, "one pod block, used twice"


def test_config_mount_path_has_one_home() -> None:
    """The ConfigMap's mount directory is named once (sc-app.configDir); everything else derives from it."""
    hits = {p.name: p.read_text().count("/etc/sc-app") for p in (CHART_DIR / "templates").iterdir()}
    assert {name: n for name, n in hits.items() if n} == {"_helpers.tpl": 1}
    job = _the(objects(render(BASE_VALUES)), "RayJob")
    config = job["spec"]["entrypoint"].split("--config ")[1]
    for template in _ray_templates(job):
        for c in _containers(template):
            (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "config"]
            assert config == f"{mount}/config.yaml", c["name"]


@pytest.mark.parametrize("values", MATRIX)
def test_every_ray_container_stops_the_run_inside_its_grace_period(values: dict[str, Any]) -> None:
    """preStop on the head AND every worker (a preempted spot GPU worker must trigger the emergency bundle too):
    the exact `sc-app stop` command on the checkpoint mount, with a wait that outlasts emergency_budget_s and
    leaves preStop.rayShutdownSeconds of every pod's grace period for Ray to shut down after the hook."""
    full = merged_values(load_values(CHART_DIR / "values.yaml"), values)
    obj = _ray_object(objects(render(values)))
    mount = full["checkpoint"]["mountPath"]
    wait, margin = full["preStop"]["waitSeconds"], full["preStop"]["rayShutdownSeconds"]
    budget = full["config"].get("checkpoint", {}).get("emergency_budget_s", 60)
    assert budget < wait
    templates = _ray_templates(obj)
    assert len(templates) == 1 + len(full["workerGroups"])
    for template in templates:
        ray = template["spec"]["containers"][0]  # KubeRay's Ray container; extraContainers follow it
        assert ray["lifecycle"]["preStop"]["exec"]["command"] == [
            "sc-app", "stop", "--checkpoint-dir", mount, "--wait", str(wait)
        ], ray["name"]
        assert template["spec"]["terminationGracePeriodSeconds"] >= wait + margin, template["metadata"]["labels"]
        assert "lifecycle" not in template["spec"].get("initContainers", [{}])[0]


def test_rendered_prestop_command_runs_against_an_idle_volume(tmp_path: Path) -> None:
    """The hook exactly as rendered (the checkpoint mount mapped to a temp dir): with no run on the volume it
    exits 0 at once, so pods of a finished job shut down without waiting."""
    sc_app = Path(sys.executable).parent / "sc-app"
    job = _the(objects(render(BASE_VALUES)), "RayJob")
    command = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["lifecycle"][
        "preStop"]["exec"]["command"]
    argv = [str(tmp_path) if a == "/checkpoints" else a for a in command]
    env = {**os.environ, "PATH": f"{sc_app.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dev_shm_is_sized_from_the_container_memory_like_kuberay() -> None:
    def shm(template: dict[str, Any]) -> dict[str, Any]:
        (vol,) = [v for v in template["spec"]["volumes"] if v["name"] == "dshm"]
        (ray,) = template["spec"]["containers"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in ray["volumeMounts"]
        return vol["emptyDir"]

    head, worker = _ray_templates(_the(objects(render(BASE_VALUES)), "RayJob"))
    assert shm(head) == {"medium": "Memory", "sizeLimit": "16Gi"}  # head limits.memory
    assert shm(worker) == {"medium": "Memory", "sizeLimit": "64Gi"}  # worker limits.memory
    group = {"name": "cpu", "accelerator": "cpu", "gpuResource": "nvidia.com/gpu", "replicas": 1,
             "terminationGracePeriodSeconds": 120, "resources": {"requests": {"memory": "8Gi"}}}
    values = merged_values(BASE_VALUES, {"head": {"shmSize": "2Gi"}, "workerGroups": [group],
                                         "config": {"trainer": {"num_gpus": 0}, "generation": {"num_gpus": 0}}})
    head, worker = _ray_templates(_the(objects(render(values)), "RayJob"))
    assert shm(head) == {"medium": "Memory", "sizeLimit": "2Gi"}  # explicit size
    assert shm(worker) == {"medium": "Memory", "sizeLimit": "8Gi"}  # no limit: the request, as KubeRay does
    values["workerGroups"][0]["resources"] = {}  # values holds a copy of group
    head, worker = _ray_templates(_the(objects(render(values)), "RayJob"))
    assert shm(worker) == {"medium": "Memory"}  # no memory at all: no size limit, as KubeRay does


@pytest.mark.parametrize("values", MATRIX)
def test_mounted_config_is_accepted_by_sc_app(values: dict[str, Any], tmp_path: Path) -> None:
    from sc_app.config.app import load_config

    objs = objects(render(values))
    text = _the(objs, "ConfigMap")["data"]["config.yaml"]
    (tmp_path / "config.yaml").write_text(text)
    cfg = load_config(tmp_path / "config.yaml")
    mount = values.get("checkpoint", {}).get("mountPath", "/checkpoints")
    assert cfg.checkpoint.dir == mount
    assert cfg.ray.address == "auto"
    assert cfg.run.max_steps == values.get("config", {}).get("run", {}).get("max_steps", 1000)


def test_schema_config_sections_match_app_config() -> None:
    from sc_app.config.app import AppConfig

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert set(schema["properties"]["config"]["properties"]) == set(AppConfig.model_fields)


def test_raycluster_mode_renders_cluster_not_job() -> None:
    values = load_values(CHART_DIR / "ci" / "raycluster-values.yaml")
    rendered = render(values)
    objs = objects(rendered)
    assert not by_kind(objs, "RayJob")
    cluster = _the(objs, "RayCluster")
    assert cluster["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"][0]["name"] == "preflight"
    assert "@sha256:" in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    notes = next(v for k, v in rendered.items() if k.endswith("NOTES.txt"))
    assert "ray job submit" in notes and "sc-app run --config /etc/sc-app/config.yaml" in notes


def test_existing_claim_hmac_and_auth_secret_are_referenced_not_created() -> None:
    values = load_values(CHART_DIR / "ci" / "gpu-existing-claim-values.yaml")
    objs = objects(render(values))
    assert not by_kind(objs, "PersistentVolumeClaim") and not by_kind(objs, "Secret")
    job = _the(objs, "RayJob")
    assert job["spec"]["activeDeadlineSeconds"] == 86400
    assert job["spec"]["preRunningDeadlineSeconds"] == 1800
    assert "submitterConfig" not in job["spec"], "HTTPMode has no submitter Job"
    assert job["spec"]["entrypoint"].endswith("'--set' 'run.seed=7'")
    assert cluster_spec(job)["authOptions"]["secretName"] == "team-ray-token"
    for template in _ray_templates(job):
        assert template["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared-ckpt-rwx"
        for c in _containers(template):
            env = {e["name"]: e for e in c["env"]}
            assert "SC_APP_CHECKPOINT_HMAC_KEY" not in env, "the key is a mounted file, never an env var"
            assert env["SC_APP_CHECKPOINT_HMAC_KEY_FILE"]["value"] == "/etc/sc-app-hmac"
            assert env["NCCL_DEBUG"]["value"] == "WARN"
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/mnt/ckpt"}
    groups = cluster_spec(job)["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer", "rollout"]
    assert [(g["minReplicas"], g["replicas"], g["maxReplicas"]) for g in groups] == [(4, 4, 4), (4, 4, 4)]
    trainer, rollout = (g["template"] for g in groups)
    assert trainer["spec"]["priorityClassName"] == "ml-high"
    assert "podAntiAffinity" in trainer["spec"]["affinity"]
    assert rollout["spec"]["schedulerName"] == "gpu-binpack-scheduler"
    assert "schedulerName" not in trainer["spec"]
    # Per-group extras land on that group only, after the release-wide ones.
    (ray,) = trainer["spec"]["containers"]
    assert [e["name"] for e in ray["env"]] == ["SC_APP_CHECKPOINT_HMAC_KEY_FILE", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME"]
    hmac = next(v for v in trainer["spec"]["volumes"] if v["name"] == "hmac-keys")
    assert hmac["secret"]["secretName"] == "sc-app-hmac"
    assert hmac["secret"]["items"] == [{"key": "key", "path": "00-key"}]
    assert ray["envFrom"] == [{"secretRef": {"name": "wandb-credentials"}}]
    assert {"name": "nccl-topo", "mountPath": "/etc/nccl", "readOnly": True} in ray["volumeMounts"]
    assert {"name": "nccl-topo", "configMap": {"name": "nccl-topology"}} in trainer["spec"]["volumes"]
    assert trainer["metadata"]["labels"]["team"] == "rl"
    assert trainer["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    (rray,) = rollout["spec"]["containers"]
    assert "envFrom" not in rray and "team" not in rollout["metadata"]["labels"]
    assert all(m["name"] != "nccl-topo" for m in rray["volumeMounts"])
    assert {v["name"]: v["emptyDir"].get("sizeLimit") for v in trainer["spec"]["volumes"] if "emptyDir" in v} == {
        "ray-tmp": None, "dshm": "32Gi", "tmp": "10Gi", "home": "10Gi"}  # read-only root: /tmp and $HOME scratch


def test_queue_labels_are_on_the_rayjob_object() -> None:
    """Kueue (and KAI, Volcano, YuniKorn) read the queue from the RayJob's own labels, not from its pods."""
    values = load_values(CHART_DIR / "ci" / "kueue-values.yaml")
    job = _the(objects(render(values)), "RayJob")
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "ml-gpu"
    assert labels["app.kubernetes.io/instance"] == "demo", "the chart's own labels stay"
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    assert cluster_spec(job)["enableInTreeAutoscaling"] is False
    for template in pod_templates(job):
        assert "kueue.x-k8s.io/queue-name" not in template["metadata"]["labels"]
    annotated = merged_values(BASE_VALUES, {"annotations": {"example.com/owner": "rl-team"}, "mode": "RayCluster"})
    cluster = _the(objects(render(annotated)), "RayCluster")
    assert cluster["metadata"]["annotations"] == {"example.com/owner": "rl-team"}


def test_deletion_rules_replace_shutdown_after_job_finishes() -> None:
    rules = [
        {"policy": "DeleteWorkers", "condition": {"jobStatus": "FAILED", "ttlSeconds": 0}},
        {"policy": "DeleteCluster", "condition": {"jobStatus": "FAILED", "ttlSeconds": 3600}},
        {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 300}},
        {"policy": "DeleteCluster", "condition": {"jobDeploymentStatus": "Failed", "ttlSeconds": 60}},
    ]
    values = merged_values(BASE_VALUES, {"job": {"shutdownAfterJobFinishes": False, "deletionRules": rules}})
    job = _the(objects(render(values)), "RayJob")
    assert job["spec"]["deletionStrategy"] == {"deletionRules": rules}
    assert job["spec"]["shutdownAfterJobFinishes"] is False
    assert "ttlSecondsAfterFinished" not in job["spec"], "KubeRay refuses a TTL without shutdownAfterJobFinishes"
    for kuberay in KUBERAY_VERSIONS:
        validate_crd_object(job, kuberay)


def test_model_from_a_read_only_claim_becomes_config_model_path() -> None:
    values = load_values(CHART_DIR / "ci" / "gpu-hf-values.yaml")
    objs = objects(render(values))
    config = yaml.safe_load(_the(objs, "ConfigMap")["data"]["config.yaml"])
    assert config["model"] == {"backend": "hf", "dtype": "bfloat16", "path": "/models/qwen2.5-0.5b-instruct"}
    for template in _ray_templates(_the(objs, "RayJob")):
        vols = {v["name"]: v for v in template["spec"]["volumes"]}
        assert vols["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
        (ray,) = template["spec"]["containers"]
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in ray["volumeMounts"]
        for init in template["spec"].get("initContainers", []):
            assert all(m["name"] != "model" for m in init["volumeMounts"]), "preflight does not read the model"
    baked = merged_values(BASE_VALUES, {"model": {"source": "image", "path": "/opt/models/tiny-gpt"}})
    objs = objects(render(baked))
    assert yaml.safe_load(_the(objs, "ConfigMap")["data"]["config.yaml"])["model"] == {"path": "/opt/models/tiny-gpt"}
    for template in _ray_templates(_the(objs, "RayJob")):
        assert all(v["name"] != "model" for v in template["spec"]["volumes"])


def test_pod_monitor_scrapes_the_metrics_port_of_head_and_workers() -> None:
    values = merged_values(BASE_VALUES, MONITORED, {"metrics": {"podMonitor": {
        "labels": {"release": "prom"}, "interval": "15s", "scrapeTimeout": "10s"}}})
    objs = objects(render(values))
    monitor = _the(objs, "PodMonitor")
    validate_crd_object(monitor)
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    selector = monitor["spec"]["selector"]
    (role,) = selector["matchExpressions"]

    def selected(labels: dict[str, str]) -> bool:
        return selector["matchLabels"].items() <= labels.items() and labels.get(role["key"]) in role["values"]

    job = _the(objs, "RayJob")
    for template in _ray_templates(job):  # every Ray pod is scraped on its named metrics port
        assert selected(template["metadata"]["labels"])
        (ray,) = template["spec"]["containers"]
        assert {"name": "metrics", "containerPort": 8080} in ray["ports"]
    assert not selected(job["spec"]["submitterPodTemplate"]["metadata"]["labels"]), "no metrics port there"
    params = [t["rayStartParams"] for t in [cluster_spec(job)["headGroupSpec"], *cluster_spec(job)["workerGroupSpecs"]]]
    assert all(p["metrics-export-port"] == "8080" for p in params)


_GPU_GROUP = {
    "name": "g",
    "accelerator": "gpu",
    "gpuResource": "nvidia.com/gpu",
    "replicas": 1,
    "resources": {"limits": {"cpu": "1"}},
    "terminationGracePeriodSeconds": 120,
}

_ONE_GPU = {"nvidia.com/gpu": 1}
_RULE = {"policy": "DeleteCluster", "condition": {"jobStatus": "SUCCEEDED", "ttlSeconds": 60}}

BAD_VALUES = [
    pytest.param({"image": {"tag": ""}}, r"image\.tag is required", id="missing-image-tag"),
    pytest.param({"image": {"tag": "latest"}}, r"image\.tag \"latest\" is refused", id="latest-tag"),
    pytest.param({"image": {"tag": "Latest"}}, r"image\.tag \"latest\" is refused", id="latest-tag-any-case"),
    pytest.param(
        {"checkpoint": {"persistence": {"accessModes": ["ReadWriteOnce"]}}},
        r"3 pods .* need(s)? ReadWriteMany",
        id="rwo-with-workers",
    ),
    pytest.param(
        {"mode": "RayCluster", "checkpoint": {"persistence": {"accessModes": ["ReadWriteOnce"]}}},
        r"ReadWriteMany",
        id="rwo-with-workers-raycluster",
    ),
    pytest.param(
        {"checkpoint": {"persistence": {"storageClassName": ""}}},
        r"storageClassName is empty with accessModes \[ReadWriteMany\]: the cluster's default class is "
        r"ReadWriteOnce-only on EKS, GKE and AKS.*standard-rwx.*azurefile-csi.*single-pod-rwo-values\.yaml",
        id="rwx-from-the-default-class",
    ),
    pytest.param({"job": {"submissionMode": "BatchMode"}}, r"submissionMode.*one of", id="unknown-submission-mode"),
    pytest.param({"job": {"backoffLimit": -1}}, r"backoffLimit.*minimum", id="negative-backoff"),
    pytest.param(
        {"job": {"submissionMode": "InteractiveMode", "backoffLimit": 2}},
        r"job\.submissionMode=InteractiveMode with job\.backoffLimit=2: KubeRay allows no retries",
        id="interactive-with-retries",
    ),
    pytest.param(
        {"job": {"suspend": True, "shutdownAfterJobFinishes": False}},
        r"job\.suspend=true with job\.shutdownAfterJobFinishes=false",
        id="suspend-keeping-cluster",
    ),
    pytest.param(
        {"job": {"deletionRules": [_RULE]}},
        r"job\.deletionRules with job\.shutdownAfterJobFinishes=true",
        id="deletion-rules-and-shutdown",
    ),
    pytest.param(
        {"job": {"shutdownAfterJobFinishes": False,
                 "deletionRules": [{"policy": "DeleteCluster", "condition": {"ttlSeconds": 5}}]}},
        r"job\.deletionRules\[0\]\.condition needs exactly one of jobStatus, jobDeploymentStatus",
        id="deletion-rule-without-condition",
    ),
    pytest.param(
        {"job": {"shutdownAfterJobFinishes": False, "deletionRules": [
            {"policy": "DeleteSelf", "condition": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed"}}]}},
        r"needs exactly one of jobStatus, jobDeploymentStatus",
        id="deletion-rule-two-conditions",
    ),
    pytest.param({"job": {"preRunningDeadlineSeconds": 0}}, r"preRunningDeadlineSeconds", id="zero-prerunning"),
    pytest.param(
        {"labels": {"kueue.x-k8s.io/queue-name": "q"}, "job": {"shutdownAfterJobFinishes": False}},
        r"labels kueue\.x-k8s\.io/queue-name with job\.shutdownAfterJobFinishes=false",
        id="kueue-keeping-cluster",
    ),
    pytest.param(
        {"labels": {"kueue.x-k8s.io/queue-name": "q"}, "config": {"trainer": {"num_gpus": 0},
                                                                  "generation": {"num_gpus": 0}},
         "workerGroups": [{**_GPU_GROUP, "name": f"g{i}", "accelerator": "cpu", "resources": {}} for i in range(7)]},
        r"7 workerGroups: a Kueue workload holds at most 8 pod sets \(head, submitter \+ 6 worker groups\)",
        id="kueue-too-many-groups",
    ),
    pytest.param(
        {"labels": {"kueue.x-k8s.io/queue-name": "q"},
         "workerGroups": [{**_GPU_GROUP, "name": "head", "replicas": 2, "resources": {"limits": _ONE_GPU}}]},
        r"name \"head\" is reserved by Kueue",
        id="kueue-group-named-head",
    ),
    pytest.param(
        {"labels": {"kueue.x-k8s.io/queue-name": "q"},
         "workerGroups": [{**_GPU_GROUP, "name": "submitter", "replicas": 2, "resources": {"limits": _ONE_GPU}}]},
        r"name \"submitter\" is reserved by Kueue for the submitter pod set",
        id="kueue-group-named-submitter",
    ),
    pytest.param(
        {"labels": {"kai.scheduler/queue": "q"}},
        r"labels kai\.scheduler/queue with job\.submissionMode=K8sJobMode",
        id="kai-with-submitter-job",
    ),
    pytest.param({"workerGroups": [_GPU_GROUP]}, r"accelerator=gpu but requests no nvidia\.com/gpu", id="gpu-no-req"),
    pytest.param(
        {"workerGroups": [{**_GPU_GROUP, "accelerator": "cpu", "resources": {"limits": {"nvidia.com/gpu": 1}}}]},
        r"accelerator=cpu but requests 1",
        id="cpu-group-with-gpu",
    ),
    pytest.param(
        {"workerGroups": [{**_GPU_GROUP, "resources": {"limits": {"nvidia.com/gpu": 1}}}] * 2},
        r"used twice",
        id="duplicate-group",
    ),
    pytest.param(
        {"config": {"trainer": {"num_workers": 2}}},
        r"config asks 3 GPUs .* but the worker groups provide 2 \(replicas x GPUs per pod\)",
        id="more-gpus-than-groups",
    ),
    pytest.param(
        {"config": {"generation": {"num_workers": 2, "num_gpus": 0.5}, "trainer": {"num_workers": 2}}},
        r"config asks 3 GPUs",
        id="fractional-gpus-over",
    ),
    pytest.param(
        {"config": {"trainer": {"spare_ranks": 1}}},
        r"config asks 3 GPUs \(\(trainer num_workers \+ spare_ranks\) x num_gpus .* provide 2",
        id="spare-gpus-over",
    ),
    pytest.param(
        {"workerGroups": [{**_GPU_GROUP, "replicas": 2, "resources": {"limits": _ONE_GPU},
                           "rayStartParams": {"num-gpus": "0"}}]},
        r"config\.trainer\.num_gpus=1 but no pod offers more than 0 GPUs",
        id="ray-num-gpus-overrides-limits",
    ),
    pytest.param(
        {"config": {"trainer": {"num_gpus": 2}, "generation": {"num_gpus": 0}}},
        r"config\.trainer\.num_gpus=2 but no pod offers more than 1 GPUs: one actor must fit on one pod",
        id="actor-larger-than-pod",
    ),
    pytest.param(
        {"workerGroups": [{**_GPU_GROUP, "replicas": 2, "maxReplicas": 4, "resources": {"limits": _ONE_GPU}}]},
        r"additional properties 'maxReplicas'",
        id="autoscaling-bounds-removed",
    ),
    pytest.param({"mode": "Deployment"}, r"/mode", id="unknown-mode"),
    pytest.param({"checkpoint": {"persistence": {"create": False}}}, r"existingClaim is required", id="no-claim"),
    pytest.param({"config": {"checkpoint": {"dir": "/tmp/x"}}}, r"config\.checkpoint\.dir is set by the chart",
                 id="config-dir-override"),
    pytest.param({"config": {"ray": {"address": "ray://x:10001"}}}, r"config\.ray\.address is set by the chart",
                 id="config-address-override"),
    pytest.param({"config": {"trainr": {"num_workers": 1}}}, r"additional properties 'trainr'", id="config-typo"),
    pytest.param({"imagee": {"tag": "x"}}, r"additional properties 'imagee'", id="unknown-top-level-key"),
    pytest.param({"job": {"activeDeadlineSeconds": 0}}, r"activeDeadlineSeconds", id="zero-deadline"),
    pytest.param(
        {"config": {"checkpoint": {"emergency_budget_s": 90}}},
        r"config\.checkpoint\.emergency_budget_s \(90\) must be below preStop\.waitSeconds \(90\)",
        id="emergency-budget-not-below-wait",
    ),
    pytest.param(
        {"head": {"terminationGracePeriodSeconds": 95}},
        r"head\.terminationGracePeriodSeconds \(95\) must be at least preStop\.waitSeconds \(90\) \+ "
        r"preStop\.rayShutdownSeconds \(10\)",
        id="head-grace-below-stop",
    ),
    pytest.param(
        {"workerGroups": [{**_GPU_GROUP, "replicas": 2, "resources": {"limits": _ONE_GPU},
                           "terminationGracePeriodSeconds": 30}]},
        r"workerGroups\[0\] \(g\)\.terminationGracePeriodSeconds \(30\) must be at least preStop\.waitSeconds",
        id="worker-grace-below-stop",
    ),
    pytest.param({"preStop": {"waitSeconds": 0}}, r"waitSeconds", id="zero-stop-wait"),
    pytest.param({"preStop": None}, r"missing property 'preStop'", id="stop-settings-removed"),
    pytest.param({"model": {"source": "claim", "path": "m"}}, r"model\.source=claim needs model\.existingClaim",
                 id="model-claim-unnamed"),
    pytest.param({"model": {"source": "claim", "existingClaim": "models"}}, r"model\.source=claim needs model\.path",
                 id="model-claim-no-path"),
    pytest.param({"model": {"source": "claim", "existingClaim": "m", "path": "x", "mountPath": "/checkpoints/"}},
                 r"model\.mountPath /checkpoints/ is checkpoint\.mountPath too", id="model-over-checkpoints"),
    pytest.param({"model": {"source": "image", "path": "models/x"}}, r"model\.source=image needs model\.path, the "
                 r"absolute directory", id="model-image-relative"),
    pytest.param({"model": {"source": "image", "path": "/m"}, "config": {"model": {"path": "/other"}}},
                 r"config\.model\.path is set by the chart from model\.source=image", id="model-path-twice"),
    pytest.param({"config": {"model": {"backend": "hf"}}}, r"config\.model\.backend=hf needs a model",
                 id="hf-without-model"),
    pytest.param({"model": {"source": "s3"}}, r"/model/source", id="model-unknown-source"),
    pytest.param({"metrics": {"podMonitor": {"interval": "often"}}}, r"/metrics/podMonitor/interval",
                 id="podmonitor-bad-interval"),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES)
def test_bad_values_are_refused_with_a_clear_message(override: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, override))
    text = str(info.value)
    assert re.search(message, text), text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 4, "one clear message, not a wall of text"


@pytest.mark.parametrize("override", [
    pytest.param({"job": {"submissionMode": "InteractiveMode", "backoffLimit": 0}}, id="interactive-no-retry"),
    pytest.param({"job": {"suspend": True}}, id="suspended"),
    pytest.param({"labels": {"kai.scheduler/queue": "q"}, "job": {"submissionMode": "HTTPMode"}}, id="kai-http"),
    pytest.param({"image": {"tag": "latest", "digest": "sha256:" + "0" * 64}}, id="latest-pinned-by-digest"),
    pytest.param({"labels": None, "annotations": None, "podAnnotations": None}, id="null-maps"),
    pytest.param({"labels": {"kueue.x-k8s.io/queue-name": "q"}, "job": {"submissionMode": "HTTPMode"},
                  "workerGroups": [{**_GPU_GROUP, "name": "submitter", "replicas": 2,
                                    "resources": {"limits": _ONE_GPU}}]},
                 id="kueue-submitter-name-free-without-submitter-job"),
    pytest.param({"config": {"trainer": {"num_gpus": 0.5}, "generation": {"num_workers": 3, "num_gpus": 0.5}}},
                 id="fractional-gpus-fit"),
])
def test_neighbours_of_refused_values_still_render(override: dict[str, Any]) -> None:
    """Each refusal is exactly as wide as what KubeRay/Kueue/KAI refuse: the allowed neighbour renders and is valid."""
    obj = _ray_object(objects(render(merged_values(BASE_VALUES, override))))
    for kuberay in KUBERAY_VERSIONS:
        validate_crd_object(obj, kuberay)


def test_strict_crd_validation_rejects_unknown_and_wrong_fields() -> None:
    job = _the(objects(render(BASE_VALUES)), "RayJob")
    validate_crd_object(job)
    typo = copy.deepcopy(job)
    typo["spec"]["backofLimit"] = 3
    with pytest.raises(jsonschema.ValidationError, match="backofLimit"):
        validate_crd_object(typo)
    nested = copy.deepcopy(job)
    nested["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["mountPath"] = "/x"
    with pytest.raises(jsonschema.ValidationError, match="mountPath"):
        validate_crd_object(nested)
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["backoffLimit"] = "5"
    with pytest.raises(jsonschema.ValidationError):
        validate_crd_object(wrong_type)
    mode = copy.deepcopy(job)
    mode["spec"]["submissionMode"] = "K8sMode"
    with pytest.raises(jsonschema.ValidationError, match="submissionMode"):
        validate_crd_object(mode)
    monitor = _the(objects(render(merged_values(BASE_VALUES, MONITORED))), "PodMonitor")
    monitor["spec"]["podMetricsEndpoints"][0]["targetPortName"] = "metrics"
    with pytest.raises(jsonschema.ValidationError, match="targetPortName"):
        validate_crd_object(monitor)


def test_render_is_deterministic_except_token() -> None:
    a = objects(render(BASE_VALUES))
    b = objects(render(BASE_VALUES))
    strip = [o for o in a if o["kind"] != "Secret"]
    assert strip == [o for o in b if o["kind"] != "Secret"]
    assert _the(a, "Secret")["data"] != _the(b, "Secret")["data"], "a fresh install gets a fresh random token"


def test_chart_metadata() -> None:
    import sc_app

    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"].startswith(">=1.")
    assert meta["appVersion"] == sc_app.__version__
    # The stated minimum KubeRay is the one every render is validated against (test_every_rendered_object_is_valid).
    assert meta["annotations"]["sc-app/kuberay-operator"] == f">={KUBERAY_MIN.removeprefix('v')}"
    for required in ["NOTES.txt", "_helpers.tpl", "_validate.tpl", "rayjob.yaml", "raycluster.yaml"]:
        assert (CHART_DIR / "templates" / required).is_file(), required


def test_no_test_reads_outside_the_checkout() -> None:
    """A plain clone runs every chart test: the CRDs are vendored and no test file reaches for ../shared."""
    from tests.k8s.k8s_helpers import CRD_DIR

    assert CRD_DIR.is_relative_to(REPO_ROOT)
    reaching_out = re.compile(r"""parents?(\[\d\])?\s*/\s*["']shared["']|\.\./shared""")
    offenders = [p for p in (REPO_ROOT / "tests").rglob("*.py") if p != Path(__file__).resolve()
                 and reaching_out.search(p.read_text())]
    assert not offenders, offenders
