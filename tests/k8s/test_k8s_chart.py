"""The Helm chart, rendered by the real Helm engine and validated like an API server would.

Covers: default and realistic values render; every core object passes kubernetes-validate (strict); every
RayJob/RayCluster passes the KubeRay v1 CRD schema (strict, defaults applied); bad values are refused with one
clear message; the mounted config is one sc-app itself accepts.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from k8s_helpers import (
    BASE_VALUES,
    CHART_DIR,
    CI_VALUES,
    CRD_DIR,
    REPO_ROOT,
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
if not CRD_DIR.is_dir():  # pragma: no cover - depends on the checkout layout
    pytest.skip(f"KubeRay CRDs not found at {CRD_DIR} (expected ../shared/kuberay-crds)", allow_module_level=True)

MATRIX = [pytest.param(BASE_VALUES, id="defaults")] + [
    pytest.param(load_values(p), id=p.stem) for p in CI_VALUES
]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


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


@pytest.mark.parametrize("values", MATRIX)
def test_every_rendered_object_is_valid(values: dict[str, Any]) -> None:
    objs = objects(render(values))
    assert {"ConfigMap"} <= {o["kind"] for o in objs}
    for obj in objs:
        if obj["apiVersion"] == "ray.io/v1":
            validate_crd_object(obj)
            for template in pod_templates(obj):
                validate_core_object(
                    {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
                )
        else:
            validate_core_object(obj)


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
    rc = spec["rayClusterSpec"]
    ray_pin = re.search(r'"ray\[default\]==([0-9.]+)"', (REPO_ROOT / "pyproject.toml").read_text())
    assert ray_pin, "pyproject.toml must pin ray[default]"
    assert rc["rayVersion"] == ray_pin.group(1), "chart rayVersion must equal the image's pinned ray"
    assert rc["authOptions"]["mode"] == "token"
    secret = _the(objs, "Secret")
    assert rc["authOptions"]["secretName"] == secret["metadata"]["name"]
    assert len(secret["data"]["auth_token"]) >= 40

    head = rc["headGroupSpec"]["template"]["spec"]
    (init,) = head["initContainers"]
    assert init["command"] == [
        "sc-app", "preflight", "--checkpoint-dir", "/checkpoints", "--config", "/etc/sc-app/config.yaml", "--json"
    ]
    assert init["image"] == head["containers"][0]["image"] == "ghcr.io/sc-app/sc-app:0.1.0"
    claim = _the(objs, "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # Same claim at the same path on the preflight, the head and every worker.
    for template in pod_templates(job)[:-1]:  # the submitter does not mount it
        vols = {v["name"]: v for v in template["spec"]["volumes"]}
        assert vols["checkpoints"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        for c in _containers(template):
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            assert mounts["checkpoints"] == "/checkpoints", c["name"]
    assert len(rc["workerGroupSpecs"]) == 1
    worker = rc["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["terminationGracePeriodSeconds"] == 120
    # Non-root everywhere.
    for template in pod_templates(job):
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
        assert template["spec"]["securityContext"]["runAsUser"] != 0
        for c in _containers(template):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False


def test_mounted_config_is_accepted_by_sc_app(tmp_path: Path) -> None:
    from sc_app.config import load_config

    for values in [BASE_VALUES, *(load_values(p) for p in CI_VALUES)]:
        objs = objects(render(values))
        text = _the(objs, "ConfigMap")["data"]["config.yaml"]
        (tmp_path / "config.yaml").write_text(text)
        cfg = load_config(tmp_path / "config.yaml")
        mount = values.get("checkpoint", {}).get("mountPath", "/checkpoints")
        assert cfg.checkpoint.dir == mount
        assert cfg.ray.address == "auto"
        assert cfg.run.max_steps == values.get("config", {}).get("run", {}).get("max_steps", 1000)


def test_schema_config_sections_match_app_config() -> None:
    from sc_app.config import AppConfig

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    assert set(schema["properties"]["config"]["properties"]) == set(AppConfig.model_fields)


def test_network_policy_admits_only_release_pods_on_every_pinned_port() -> None:
    objs = objects(render(BASE_VALUES))
    policy = _the(objs, "NetworkPolicy")
    job = _the(objs, "RayJob")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for template in pod_templates(job):  # every pod of the release is covered by the policy
        assert selector.items() <= template["metadata"]["labels"].items()
    own, operator = policy["spec"]["ingress"]
    assert own["from"] == [{"podSelector": {"matchLabels": selector}}]
    allowed: set[int] = set()
    for port in own["ports"]:
        allowed.update(range(port["port"], port.get("endPort", port["port"]) + 1))
    rc = cluster_spec(job)
    params = [rc["headGroupSpec"]["rayStartParams"]] + [g["rayStartParams"] for g in rc["workerGroupSpecs"]]
    for p in params:
        for key, val in p.items():
            if key.endswith("port"):
                assert int(val) in allowed, key
    assert {p["port"] for p in operator["ports"]} == {8265}
    assert "podSelector" not in operator["from"][0]


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
    assert job["spec"]["entrypoint"].endswith("'--set' 'run.seed=7'")
    assert cluster_spec(job)["authOptions"]["secretName"] == "team-ray-token"
    for template in pod_templates(job)[:3]:
        assert template["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "shared-ckpt-rwx"
        for c in _containers(template):
            env = {e["name"]: e for e in c["env"]}
            ref = env["SC_APP_CHECKPOINT_HMAC_KEY"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "sc-app-hmac", "key": "key"}
            assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/mnt/ckpt"}
    groups = cluster_spec(job)["workerGroupSpecs"]
    assert [g["groupName"] for g in groups] == ["trainer", "rollout"]
    assert (groups[1]["minReplicas"], groups[1]["replicas"], groups[1]["maxReplicas"]) == (2, 4, 6)
    assert groups[0]["template"]["spec"]["priorityClassName"] == "ml-high"
    assert "podAntiAffinity" in groups[0]["template"]["spec"]["affinity"]


_GPU_GROUP = {
    "name": "g",
    "accelerator": "gpu",
    "gpuResource": "nvidia.com/gpu",
    "replicas": 1,
    "resources": {"limits": {"cpu": "1"}},
    "terminationGracePeriodSeconds": 30,
}

_ONE_GPU = {"nvidia.com/gpu": 1}

BAD_VALUES = [
    pytest.param({"image": {"tag": ""}}, r"image\.tag is required", id="missing-image-tag"),
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
    pytest.param({"job": {"submissionMode": "BatchMode"}}, r"submissionMode.*one of", id="unknown-submission-mode"),
    pytest.param({"job": {"backoffLimit": -1}}, r"backoffLimit.*minimum", id="negative-backoff"),
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
        {"workerGroups": [{**_GPU_GROUP, "replicas": 5, "maxReplicas": 2, "resources": {"limits": _ONE_GPU}}]},
        r"minReplicas <= replicas <= maxReplicas",
        id="replicas-above-max",
    ),
    pytest.param({"mode": "Deployment"}, r"/mode", id="unknown-mode"),
    pytest.param({"checkpoint": {"persistence": {"create": False}}}, r"existingClaim is required", id="no-claim"),
    pytest.param({"config": {"checkpoint": {"dir": "/tmp/x"}}}, r"config\.checkpoint\.dir is set by the chart",
                 id="config-dir-override"),
    pytest.param({"config": {"trainr": {"num_workers": 1}}}, r"additional properties 'trainr'", id="config-typo"),
    pytest.param({"imagee": {"tag": "x"}}, r"additional properties 'imagee'", id="unknown-top-level-key"),
    pytest.param({"job": {"activeDeadlineSeconds": 0}}, r"activeDeadlineSeconds", id="zero-deadline"),
    pytest.param(
        {"config": {"checkpoint": {"emergency_budget_s": 150}}},
        r"emergency_budget_s \(150\) must be below head\.terminationGracePeriodSeconds \(120\)",
        id="emergency-budget-over-grace",
    ),
]


@pytest.mark.parametrize(("override", "message"), BAD_VALUES)
def test_bad_values_are_refused_with_a_clear_message(override: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as info:
        render(_merge(BASE_VALUES, override))
    text = str(info.value)
    assert re.search(message, text), text
    assert len([ln for ln in text.splitlines() if ln.strip()]) <= 4, "one clear message, not a wall of text"


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


def test_values_yaml_documents_every_field() -> None:
    """Every key has a comment on its line or right above it, or sits under a parent key documented that way."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(- )?([A-Za-z][\w./-]*):", line)
        if not m:
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        above = lines[i - 1].strip() if i else ""
        own = "#" in line or above.startswith("#") or above.startswith("- #")
        documented = own or (bool(stack) and stack[-1][1])
        if not documented:
            undocumented.append(f"line {i + 1}: {line.strip()}")
        stack.append((indent, own))
    assert not undocumented, "undocumented values: " + "; ".join(undocumented)


def test_render_is_fast_and_deterministic_except_token() -> None:
    start = time.perf_counter()
    a = objects(render(BASE_VALUES))
    elapsed = time.perf_counter() - start
    b = objects(render(BASE_VALUES))
    assert elapsed < 2.0, f"render took {elapsed:.2f}s"
    strip = [o for o in a if o["kind"] != "Secret"]
    assert strip == [o for o in b if o["kind"] != "Secret"]
    assert _the(a, "Secret")["data"] != _the(b, "Secret")["data"], "a fresh install gets a fresh random token"


def test_chart_metadata() -> None:
    import sc_app

    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["kubeVersion"].startswith(">=1.")
    assert meta["appVersion"] == sc_app.__version__
    for required in ["NOTES.txt", "_helpers.tpl", "_validate.tpl", "rayjob.yaml", "raycluster.yaml"]:
        assert (CHART_DIR / "templates" / required).is_file(), required
