"""Shared helpers for the Kubernetes-kit tests: render the chart with the real Helm engine, validate objects.

Invariants: rendering never contacts a cluster (``lookup`` returns nothing); CRD validation is strict (unknown fields
fail, like a structural schema with pruning turned into an error) and applies schema defaults before ``required``;
the CRDs come from ``tests/k8s/crds/`` in this repository (SOURCE.txt there), never from outside the checkout.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from sc_app.k8s.release import deep_merge

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "sc-app"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*.yaml"))
CRD_DIR = Path(__file__).resolve().parent / "crds"
# The chart's minimum KubeRay (Chart.yaml annotation sc-app/kuberay-operator) and the newest release.
KUBERAY_MIN = "v1.6.0"
KUBERAY_VERSIONS = (KUBERAY_MIN, "v1.7.0")
PROMETHEUS_OPERATOR = "v0.93.0"
_CRD_FILES = {
    ("ray.io/v1", "RayJob"): "ray.io_rayjobs.yaml",
    ("ray.io/v1", "RayCluster"): "ray.io_rayclusters.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml",
}
K8S_VERSION = "1.31.0"
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode"}
# The chart's defaults plus what it requires: an image tag and, with the default ReadWriteMany claim, a named class.
RWX_CLASS = "efs-sc"
BASE_VALUES: dict[str, Any] = {"image": {"tag": "0.1.0"},
                               "checkpoint": {"persistence": {"storageClassName": RWX_CLASS}}}


def load_values(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def merged_values(base: dict[str, Any], *overs: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with each of ``overs`` merged in as ``sc-app k8s`` merges values files (maps merge, any
    other value replaces); neither argument is changed."""
    out = copy.deepcopy(base)
    for over in overs:
        deep_merge(out, copy.deepcopy(over))
    return out


def sim_worker_values() -> dict[str, Any]:
    """ci/cpu-values.yaml with the checkpoint claim shared (head and worker mount it) and one CPU worker group that
    offers the ``sim_worker`` resource, which the trainer and the TransferQueue storage unit are placed on: the
    release the pod stand-in tests run as a real two-pod job."""
    values = load_values(CHART_DIR / "ci" / "cpu-values.yaml")
    values["checkpoint"]["persistence"].update(accessModes=["ReadWriteMany"], storageClassName=RWX_CLASS)
    values["workerGroups"] = [{
        "name": "cpu", "accelerator": "cpu", "gpuResource": "nvidia.com/gpu", "replicas": 1,
        "terminationGracePeriodSeconds": 120,
        "rayStartParams": {"resources": '"{\\"sim_worker\\": 4}"'},  # KubeRay's documented quoting
        "resources": {"requests": {"cpu": "3", "memory": "4Gi"}, "limits": {"cpu": "3", "memory": "4Gi"}},
    }]
    values["config"]["trainer"]["resources"] = {"sim_worker": 1}
    values["config"]["data_plane"]["storage_node_resource"] = "sim_worker"
    return values


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


def crd_path(api_version: str, kind: str, kuberay: str = KUBERAY_VERSIONS[-1]) -> Path:
    """The vendored CRD file of ``kind`` (ray.io kinds at KubeRay release ``kuberay``)."""
    group = api_version.split("/")[0]
    folder = f"kuberay-{kuberay}" if group == "ray.io" else f"prometheus-operator-{PROMETHEUS_OPERATOR}"
    return CRD_DIR / folder / _CRD_FILES[(api_version, kind)]


@functools.cache
def load_crd(path: Path) -> dict[str, Any]:
    """A vendored CRD, parsed once per test session (they are large)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@functools.cache
def crd_schema(api_version: str, kind: str, kuberay: str = KUBERAY_VERSIONS[-1]) -> dict[str, Any]:
    """The strict openAPIV3Schema of ``kind`` at ``api_version`` from the vendored CRD."""
    crd = load_crd(crd_path(api_version, kind, kuberay))
    version = api_version.split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return _strictify(served["schema"]["openAPIV3Schema"])


@functools.cache
def _validator(api_version: str, kind: str, kuberay: str) -> jsonschema.Draft7Validator:
    """One compiled validator per kind (the CRD schemas are large; checking the schema itself once is enough)."""
    schema = crd_schema(api_version, kind, kuberay)
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


def is_custom(obj: dict[str, Any]) -> bool:
    """True for the kinds validated against a vendored CRD rather than Kubernetes' own OpenAPI."""
    return (obj.get("apiVersion"), obj.get("kind")) in _CRD_FILES


def validate_crd_object(obj: dict[str, Any], kuberay: str = KUBERAY_VERSIONS[-1]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is valid against its vendored CRD (strict, defaults
    applied); ray.io kinds against the CRDs of KubeRay release ``kuberay``."""
    api_version, kind = obj["apiVersion"], obj["kind"]
    assert (api_version, kind) in _CRD_FILES, f"no vendored CRD for {api_version} {kind}"
    schema = crd_schema(api_version, kind, kuberay)
    # metadata is validated by the API server's ObjectMeta, not the CRD schema: check it as core metadata.
    body = apply_defaults(copy.deepcopy(obj), schema)
    error = jsonschema.exceptions.best_match(_validator(api_version, kind, kuberay).iter_errors(body))
    if error is not None:
        raise error
    if kind == "RayJob":
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


def render_live(api_server: str, values: dict[str, Any] | None = None, *, name: str = "demo", namespace: str = "ml",
                upgrade: bool = True) -> dict[str, str]:
    """Render like ``helm upgrade``/``install`` does: cluster-aware, so ``lookup`` reads ``api_server``."""
    import helm_python

    chart = helm_python.Chart.load(CHART_DIR)
    config = helm_python.Config(kube_apiserver=api_server, kube_token="test", namespace=namespace)
    try:
        return config.render(chart, values or {}, name=name, namespace=namespace, is_upgrade=upgrade,
                             is_install=not upgrade)
    finally:
        config.close()
