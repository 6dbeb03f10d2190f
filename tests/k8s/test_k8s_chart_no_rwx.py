"""The chart's no-RWX profile (issue 28 part 2): ``checkpoint.volume=local`` gives each pod its own checkpoint
directory (an emptyDir, or a ReadWriteOnce claim per pod: a generic ephemeral volume) and no PVC, and needs the
bucket of ``config.checkpoint.remote.url``: refused at render, with one line, when neither a shared volume nor a
bucket would outlive the pods. Rendered by the real Helm engine (helm_python); ``sc-app k8s submit`` against the
API-server stand-in checks the per-pod claim's StorageClass before it writes anything."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

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
    validate_crd_object,
)

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (k8s extra) is not installed")
pytest.importorskip("kubernetes", reason="kubernetes client (k8s extra) is not installed")

from sc_app.config.app import AppConfig  # noqa: E402
from sc_app.k8s.cli import main  # noqa: E402

PROFILE = CHART_DIR / "ci" / "no-rwx-values.yaml"
BUCKET = {"config": {"checkpoint": {"remote": {"url": "s3://ml-checkpoints/jobs/x"}}}}
WORKERS = {"workerGroups": [{"name": "gpu", "accelerator": "gpu", "gpuResource": "nvidia.com/gpu", "replicas": 2,
                             "terminationGracePeriodSeconds": 120,
                             "resources": {"limits": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}}]}


def _job(values: dict[str, Any]) -> dict[str, Any]:
    (job,) = by_kind(objects(render(values)), "RayJob")
    return job


def _ray_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Head and worker pod templates (the submitter mounts no checkpoint directory)."""
    return pod_templates(job)[:-1] if "submitterPodTemplate" in job["spec"] else pod_templates(job)


def _checkpoint_volume(template: dict[str, Any]) -> dict[str, Any]:
    (vol,) = [v for v in template["spec"]["volumes"] if v["name"] == "checkpoints"]
    return vol


def _mounts(template: dict[str, Any]) -> list[str]:
    spec = template["spec"]
    return [m["mountPath"] for c in [*spec.get("initContainers", []), *spec["containers"]]
            for m in c.get("volumeMounts", []) if m["name"] == "checkpoints"]


def test_the_no_rwx_profile_gives_every_pod_its_own_rwo_claim_and_renders_no_pvc() -> None:
    values = load_values(PROFILE)
    rendered = render(values)
    notes = next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))
    assert ("Checkpoints: each pod's own directory (ephemeral) at /checkpoints, no shared volume; uploaded to\n"
            "s3://ml-checkpoints/jobs/grpo-7b, which a new attempt resumes from.") in notes, notes
    objs = objects(rendered)
    assert not by_kind(objs, "PersistentVolumeClaim"), "no shared claim without a shared volume"
    (job,) = by_kind(objs, "RayJob")
    pods = _ray_pods(job)
    assert len(pods) == 2  # head + the generation group (2 replicas, one template)
    for template in pods:
        claim = _checkpoint_volume(template)["ephemeral"]["volumeClaimTemplate"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "300Gi"
        assert "storageClassName" not in claim["spec"], "'' is the cluster default: left unset"
        assert claim["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
        assert _mounts(template) and set(_mounts(template)) == {"/checkpoints"}
    assert len(_mounts(pods[0])) == 2, "the head's preflight (it brings the bucket's bundle home) mounts it too"
    config = yaml.safe_load(by_kind(objs, "ConfigMap")[0]["data"]["config.yaml"])
    assert config["checkpoint"]["dir"] == "/checkpoints"
    # the app is told each pod has its own disk there: a trainer rank on a worker pod stages its part of a bundle
    # on its own disk for the controller to gather (sc_app.checkpoint.node_parts); nothing pins it to the head
    assert config["checkpoint"]["volume"] == "local"
    assert "resources" not in config["trainer"] and "storage_node_resource" not in config["data_plane"]
    head_params = job["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]
    assert "resources" not in head_params
    assert config["checkpoint"]["remote"]["url"] == "s3://ml-checkpoints/jobs/grpo-7b"
    # each rank uploads its own part: no byte of it passes through the head (sc_app.checkpoint.remote.parts)
    assert AppConfig.model_validate(config).checkpoint.remote.parts == "direct"
    (account,) = by_kind(objs, "ServiceAccount")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    assert {t["spec"]["serviceAccountName"] for t in pods} == {account["metadata"]["name"]}
    for kuberay in KUBERAY_VERSIONS:
        validate_crd_object(job, kuberay)


@pytest.mark.parametrize(("local", "expected"), [
    ({"medium": "emptyDir"}, {"emptyDir": {}}),
    ({"medium": "emptyDir", "sizeLimit": "200Gi"}, {"emptyDir": {"sizeLimit": "200Gi"}}),
    ({"medium": "ephemeral", "storageClassName": "gp3", "size": "50Gi"},
     {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
                                                      "resources": {"requests": {"storage": "50Gi"}}}}}}),
], ids=["emptydir", "emptydir-size-limit", "ephemeral-class"])
def test_local_media_render_as_asked_on_every_pod(local: dict[str, Any], expected: dict[str, Any]) -> None:
    # BASE_VALUES' RWX class is ignored (persistence has no say with volume=local)
    job = _job(merged_values(BASE_VALUES, WORKERS, BUCKET, {"checkpoint": {"volume": "local", "local": local}}))
    for template in _ray_pods(job):
        vol = _checkpoint_volume(template)
        vol.pop("name")
        if "ephemeral" in vol:
            vol["ephemeral"]["volumeClaimTemplate"].pop("metadata")
        assert vol == expected


def test_the_app_config_says_local_only_with_volume_local() -> None:
    shared = yaml.safe_load(by_kind(objects(render(merged_values(BASE_VALUES, WORKERS))), "ConfigMap")[0]["data"]
                            ["config.yaml"])  # fmt: skip
    assert "volume" not in shared["checkpoint"], "the app's default (shared) is left to the app"
    local = merged_values(BASE_VALUES, WORKERS, BUCKET, {"checkpoint": {"volume": "local"}})
    config = yaml.safe_load(by_kind(objects(render(local)), "ConfigMap")[0]["data"]["config.yaml"])
    assert config["checkpoint"]["volume"] == "local"
    assert AppConfig.model_validate(config).checkpoint.volume == "local", "the rendered config is one the app takes"


def test_local_ignores_the_persistence_rules_that_only_a_shared_claim_needs() -> None:
    """The shared default (ReadWriteMany from the cluster's default class) is refused; with volume=local the same
    persistence values render, because no claim is made from them."""
    shared = merged_values({"image": {"tag": "0.1.0"}}, WORKERS, BUCKET)
    with pytest.raises(helm_python.HelmError, match=r"storageClassName is empty with accessModes"):
        render(shared)
    job = _job(merged_values(shared, {"checkpoint": {"volume": "local"}}))
    assert all("persistentVolumeClaim" not in _checkpoint_volume(t) for t in _ray_pods(job))


@pytest.mark.parametrize("override", [
    pytest.param(merged_values(WORKERS, {"checkpoint": {"volume": "local"}}), id="workers-emptydir"),
    pytest.param({"workerGroups": [], "checkpoint": {"volume": "local", "local": {"medium": "ephemeral"}}},
                 id="one-pod-per-pod-claim"),
    pytest.param(merged_values(WORKERS, {"checkpoint": {"volume": "local"},
                                         "config": {"checkpoint": {"remote": {"url": ""}}}}), id="empty-url"),
])
def test_neither_a_shared_volume_nor_a_bucket_is_refused_with_one_line(override: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, override))
    text = str(info.value)
    assert re.search(r"checkpoint\.volume=local without config\.checkpoint\.remote\.url: each of the \d+ pods would "
                     r"keep its bundles on its own disk, lost with the pod; set config\.checkpoint\.remote\.url", text)
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 4, text


def test_an_rwo_shared_claim_with_workers_is_refused_naming_the_bucket_profile() -> None:
    rwo = {"checkpoint": {"persistence": {"accessModes": ["ReadWriteOnce"]}}}
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(BASE_VALUES, WORKERS, rwo))
    assert re.search(r"3 pods .* needs ReadWriteMany.*checkpoint\.volume=local with config\.checkpoint\.remote\.url, "
                     r"helm/sc-app/ci/no-rwx-values\.yaml", str(info.value)), str(info.value)
    assert (CHART_DIR / "ci" / "no-rwx-values.yaml").is_file(), "the refusal names an example that exists"


def test_the_schema_refuses_an_unknown_volume_or_medium() -> None:
    for bad in ({"volume": "rwx"}, {"volume": "local", "local": {"medium": "hostPath"}}):
        with pytest.raises(helm_python.HelmError, match=r"/checkpoint/(volume|local/medium)"):
            render(merged_values(BASE_VALUES, BUCKET, {"checkpoint": bad}))


# ---- sc-app k8s submit / delete against the API-server stand-in -------------------------------------------------

def _profile_file(tmp_path: Path, storage_class: str) -> str:
    values = merged_values(load_values(PROFILE), {"checkpoint": {"local": {"storageClassName": storage_class}}})
    path = tmp_path / "no-rwx.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _k8s(kubeconfig: str, *argv: str) -> int:
    return main(["k8s", argv[0], "demo", "-n", "ml", "--kubeconfig", kubeconfig, *argv[1:]])


def test_submit_refuses_a_per_pod_claim_of_a_missing_class_before_writing_anything(api, capsys, tmp_path) -> None:
    server, kc = api
    assert _k8s(kc, "submit", "-f", _profile_file(tmp_path, "gp3")) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert err == ["sc-app k8s: error: each pod's checkpoint claim: StorageClass gp3 does not exist on this cluster; "
                   "fix checkpoint.local.storageClassName"], err
    assert not [r for r in server.requests if r[0] != "GET"], "nothing may be written"


def test_submit_and_delete_a_no_rwx_release(api, capsys, tmp_path) -> None:
    server, kc = api
    server.add("storageclasses", {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                                  "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com"}, ns="")
    assert _k8s(kc, "submit", "-f", _profile_file(tmp_path, "gp3")) == 0, capsys.readouterr().err
    assert "created rayjob/demo-sc-app" in capsys.readouterr().out
    assert not [k for k in server.store if k[0] == "persistentvolumeclaims"], "no shared claim is created"
    assert _k8s(kc, "delete", "-f", _profile_file(tmp_path, "gp3"), "--timeout", "5") == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "no checkpoint PVC (checkpoint.volume=local): the bundles the job kept are on its bucket" in out, out
    assert "kept persistentvolumeclaim" not in out


# ---- the bucket's credentials by AWS web identity (GKE, AKS, on-prem -> AWS S3) ----------------------------------

ROLE = "arn:aws:iam::123456789012:role/sc-app-checkpoints"


def _profile_without_irsa() -> dict[str, Any]:
    values = load_values(PROFILE)
    values["serviceAccount"]["annotations"] = {}
    return values


def _sc_app_containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), spec["containers"][0]]


def test_aws_web_identity_reaches_every_sc_app_container_preflight_included() -> None:
    values = merged_values(_profile_without_irsa(), {"checkpoint": {
        "awsWebIdentity": {"roleArn": ROLE, "audience": "sts.amazonaws.com", "expirationSeconds": 7200}}})
    job = _job(values)
    containers = 0
    for template in _ray_pods(job):
        (vol,) = [v for v in template["spec"]["volumes"] if v["name"] == "aws-web-identity"]
        assert vol["projected"]["sources"] == [{"serviceAccountToken": {
            "audience": "sts.amazonaws.com", "expirationSeconds": 7200, "path": "token"}}]
        for c in _sc_app_containers(template):
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env["AWS_ROLE_ARN"] == ROLE, c["name"]
            assert env["AWS_WEB_IDENTITY_TOKEN_FILE"] == "/var/run/secrets/sc-app/aws/token", c["name"]
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "aws-web-identity"]
            assert mount == {"name": "aws-web-identity", "mountPath": "/var/run/secrets/sc-app/aws", "readOnly": True}
            containers += 1
    assert containers == 3, "head preflight, head, worker"
    for kuberay in KUBERAY_VERSIONS:
        validate_crd_object(job, kuberay)


def test_no_aws_identity_is_rendered_unless_asked() -> None:
    job = _job(_profile_without_irsa())
    for template in _ray_pods(job):
        assert "aws-web-identity" not in {v["name"] for v in template["spec"]["volumes"]}
        for c in _sc_app_containers(template):
            assert not [e for e in c.get("env", []) if e["name"].startswith("AWS_")], c["name"]


@pytest.mark.parametrize(("identity", "message"), [
    ({"roleArn": ROLE}, r"checkpoint\.awsWebIdentity\.roleArn and serviceAccount\.annotations "
                        r"eks\.amazonaws\.com/role-arn both give the pods an AWS role"),
    ({"roleArn": "role/x"}, r"/checkpoint/awsWebIdentity/roleArn"),
    ({"roleArn": ROLE, "expirationSeconds": 60}, r"/checkpoint/awsWebIdentity/expirationSeconds"),
], ids=["irsa-and-roleArn", "not-an-arn", "short-token"])
def test_bad_aws_web_identity_is_refused(identity: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(merged_values(load_values(PROFILE), {"checkpoint": {"awsWebIdentity": identity}}))
    assert re.search(message, str(info.value)), str(info.value)
