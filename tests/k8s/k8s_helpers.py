"""Shared helpers for the Kubernetes-kit tests: render the chart with the real Helm engine, validate objects.

Invariants: rendering never contacts a cluster (``lookup`` returns nothing); CRD validation is strict (unknown fields
fail, like a structural schema with pruning turned into an error) and applies schema defaults before ``required``.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "sc-app"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))
CRD_DIR = REPO_ROOT.parent / "shared" / "kuberay-crds"
K8S_VERSION = "1.31.0"
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode"}
BASE_VALUES: dict[str, Any] = {"image": {"tag": "0.1.0"}}


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any] | None = None, *, name: str = "demo", namespace: str = "ml") -> dict[str, str]:
    """Template path → rendered text, through helm_python (Helm v4 engine, schema validation included)."""
    import helm_python

    chart = helm_python.Chart.load(CHART_DIR)
    return chart.render(values or {}, name=name, namespace=namespace, is_install=True)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object in a render (NOTES.txt excluded)."""
    out: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o.get("kind") == kind]


def _strictify(node: Any) -> Any:
    """Drop ``x-kubernetes-*`` keys; close every object schema that lists properties (unknown fields fail)."""
    if isinstance(node, list):
        return [_strictify(n) for n in node]
    if not isinstance(node, dict):
        return node
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    out = {k: _strictify(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The strict openAPIV3Schema of ray.io/v1 ``kind`` from ../shared/kuberay-crds."""
    fname = {"RayJob": "ray.io_rayjobs.yaml", "RayCluster": "ray.io_rayclusters.yaml"}[kind]
    crd = yaml.safe_load((CRD_DIR / fname).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return _strictify(version["schema"]["openAPIV3Schema"])


@functools.cache
def _validator(kind: str) -> jsonschema.Draft7Validator:
    """One compiled validator per kind (the CRD schemas are large; checking the schema itself once is enough)."""
    schema = crd_schema(kind)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def apply_defaults(instance: Any, schema: dict[str, Any]) -> Any:
    """Fill schema ``default``s into ``instance`` the way the API server does before validation."""
    if isinstance(instance, dict) and schema.get("type") == "object":
        for key, sub in schema.get("properties", {}).items():
            if key not in instance and "default" in sub:
                instance[key] = copy.deepcopy(sub["default"])
            if key in instance:
                apply_defaults(instance[key], sub)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in set(instance) - set(schema.get("properties", {})):
                apply_defaults(instance[key], extra)
    elif isinstance(instance, list) and isinstance(schema.get("items"), dict):
        for item in instance:
            apply_defaults(item, schema["items"])
    return instance


def validate_crd_object(obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is a valid ray.io/v1 RayJob/RayCluster."""
    assert obj["apiVersion"] == "ray.io/v1", obj["apiVersion"]
    schema = crd_schema(obj["kind"])
    # metadata is validated by the API server's ObjectMeta, not the CRD schema: check it as core metadata.
    body = apply_defaults(copy.deepcopy(obj), schema)
    error = jsonschema.exceptions.best_match(_validator(obj["kind"]).iter_errors(body))
    if error is not None:
        raise error
    if obj["kind"] == "RayJob":
        mode = obj["spec"].get("submissionMode", "K8sJobMode")
        if mode not in SUBMISSION_MODES:
            raise jsonschema.ValidationError(f"spec.submissionMode {mode!r} not in {sorted(SUBMISSION_MODES)}")


def validate_core_object(obj: dict[str, Any]) -> None:
    """Strict validation of a core/built-in kind against Kubernetes' own OpenAPI schemas."""
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every PodTemplateSpec inside a RayJob/RayCluster (head, workers, submitter)."""
    spec = obj["spec"]
    cluster = spec["rayClusterSpec"] if obj["kind"] == "RayJob" else spec
    out = [cluster["headGroupSpec"]["template"]]
    out += [g["template"] for g in cluster.get("workerGroupSpecs", [])]
    if "submitterPodTemplate" in spec:
        out.append(spec["submitterPodTemplate"])
    return out


def cluster_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["rayClusterSpec"] if obj["kind"] == "RayJob" else obj["spec"]
