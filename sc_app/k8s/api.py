"""RayJob operations against a Kubernetes API server with the official ``kubernetes`` client.

Invariants: every API failure surfaces as ``K8sError`` whose ``str()`` is one line naming the object, the cause
and what to do; ``delete`` never touches the checkpoint PVC (bundles outlive every job); ``status`` only reads.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
# JobDeploymentStatus values after which KubeRay does nothing more for the job.
TERMINAL = {"Complete", "Failed", "ValidationFailed"}
# Core kinds ``submit`` creates besides the RayJob: kind → (api path segment, plural).
CORE_PATHS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}


class K8sError(RuntimeError):
    """One clear line about a failed API call."""


def _status_body(body: Any) -> dict[str, Any] | None:
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    if not isinstance(body, str):
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None


def explain(exc: BaseException, what: str, namespace: str) -> K8sError:
    """Map a client exception for ``what`` (e.g. ``rayjob/x``) to one line."""
    from kubernetes.client.exceptions import ApiException

    if not isinstance(exc, ApiException):
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return K8sError(f"{what}: cannot reach the Kubernetes API server ({text}); check your kubeconfig/context")
    status = _status_body(exc.body)
    message = (status or {}).get("message") or (exc.reason or "").strip()
    reason = (status or {}).get("reason", "")
    code = exc.status
    if code == 404 and status is None and what.startswith("rayjob"):
        return K8sError(
            f"{what}: the RayJob API (ray.io/v1 rayjobs) is not served by this cluster: install the KubeRay "
            "operator and its CRDs first (ops/README.md, Install)"
        )
    if code == 404:
        return K8sError(f"{what} not found in namespace {namespace}" + (f" ({message})" if message else ""))
    if code == 403:
        return K8sError(f"forbidden: {message or what}; ask for RBAC on this resource in namespace {namespace}")
    if code == 401:
        return K8sError(f"{what}: unauthorized: the API server rejected your credentials; refresh your kubeconfig")
    if code == 409 and reason == "AlreadyExists":
        return K8sError(f"{what} already exists in namespace {namespace}; delete it first or choose another --name")
    if code == 409:
        return K8sError(f"{what}: conflict ({message or 'changed concurrently'}); re-read it and retry")
    if code == 422 or reason == "Invalid":
        return K8sError(f"{what} rejected as invalid: {message}")
    return K8sError(f"{what}: API server answered {code} {reason or exc.reason}: {message}".rstrip(": "))


@dataclass
class JobStatus:
    """What ``sc-app k8s status`` shows about one RayJob."""

    name: str
    deployment_status: str
    job_status: str
    failed: int
    succeeded: int
    backoff_limit: int
    suspended: bool
    cluster: str
    message: str
    resume_step: int | None
    resume_decision: str | None

    @property
    def finished(self) -> bool:
        return self.deployment_status in TERMINAL

    @property
    def retries_used(self) -> int:
        """Attempts beyond the first (KubeRay counts failed attempts in status.failed)."""
        return self.failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "jobDeploymentStatus": self.deployment_status,
            "jobStatus": self.job_status,
            "retriesUsed": self.retries_used,
            "backoffLimit": self.backoff_limit,
            "suspended": self.suspended,
            "rayCluster": self.cluster,
            "message": self.message,
            "resumeStep": self.resume_step,
            "resumeDecision": self.resume_decision,
        }

    def lines(self) -> list[str]:
        step = (
            "unknown (no preflight log yet)"
            if self.resume_decision is None
            else (f"step {self.resume_step}" if self.resume_step is not None else "none (fresh start)")
        )
        return [
            f"rayjob/{self.name}: {self.deployment_status or 'New'}"
            + (" (suspended)" if self.suspended else "")
            + (f", job {self.job_status}" if self.job_status else ""),
            f"retries used: {self.retries_used} of backoffLimit {self.backoff_limit}",
            f"newest bundle at the last (re)start: {step}"
            + (f" [{self.resume_decision}]" if self.resume_decision else ""),
        ] + ([f"message: {self.message}"] if self.message else [])


class RayJobs:
    """RayJob verbs in one namespace. ``api_client`` is a configured ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any, namespace: str) -> None:
        from kubernetes import client

        self.namespace = namespace
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    # ---------------------------------------------------------------- helpers
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise explain(exc, what, self.namespace) from None

    def _create_core(self, obj: dict[str, Any]) -> str:
        base, plural = CORE_PATHS[obj["kind"]]
        name = obj["metadata"]["name"]
        what = f"{obj['kind'].lower()}/{name}"
        path = f"{base}/namespaces/{self.namespace}/{plural}"
        try:
            response = self.api_client.call_api(*self._req("POST", path, body=obj))
            response.read()
            self.api_client.response_deserialize(response, {"2XX": "object"})
            return f"created {what}"
        except Exception as exc:
            err = explain(exc, what, self.namespace)
            if "already exists" in str(err):
                return f"kept existing {what}"
            raise err from None

    def _req(self, method: str, path: str, body: Any = None) -> tuple[Any, ...]:
        """Serialize a raw request the same way the generated APIs do; returns ``call_api`` positional args."""
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        return self.api_client.param_serialize(
            method=method, resource_path=path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )

    # ---------------------------------------------------------------- verbs
    def submit(self, objects: list[dict[str, Any]]) -> list[str]:
        """Create the companions (kept when they exist), then the RayJob (an existing one is an error)."""
        done: list[str] = []
        ray = [o for o in objects if o.get("apiVersion") == "ray.io/v1"]
        if len(ray) != 1 or ray[0]["kind"] != "RayJob":
            raise K8sError("submit needs mode: RayJob values (for a RayCluster use helm install)")
        job = ray[0]
        name = job["metadata"]["name"]
        # Fail early and clearly when the CRD is missing or the job exists, before creating anything else.
        try:
            self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
            raise K8sError(
                f"rayjob/{name} already exists in namespace {self.namespace}; delete it first or choose another --name"
            )
        except K8sError:
            raise
        except Exception as exc:
            err = explain(exc, f"rayjob/{name}", self.namespace)
            if "not found in namespace" not in str(err):
                raise err from None
        for obj in objects:
            if obj is not job:
                done.append(self._create_core(obj))
        self._call(
            f"rayjob/{name}", self.custom.create_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, job
        )
        done.append(f"created rayjob/{name}")
        return done

    def get(self, name: str) -> dict[str, Any]:
        return self._call(
            f"rayjob/{name}", self.custom.get_namespaced_custom_object, GROUP, VERSION, self.namespace, PLURAL, name
        )

    def set_suspend(self, name: str, suspend: bool) -> None:
        self._call(
            f"rayjob/{name}",
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            {"spec": {"suspend": suspend}},
            _content_type="application/merge-patch+json",
        )

    def delete(self, name: str) -> None:
        self._call(
            f"rayjob/{name}",
            self.custom.delete_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            name,
            propagation_policy="Background",
        )

    def resume_point(self, cluster: str) -> tuple[int | None, str | None]:
        """(step, decision) from the head's preflight initContainer log (JSON); (None, None) when unavailable."""
        if not cluster:
            return None, None
        try:
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"ray.io/cluster={cluster},ray.io/node-type=head"
            )
            if not pods.items:
                return None, None
            text = self.core.read_namespaced_pod_log(pods.items[0].metadata.name, self.namespace, container="preflight")
        except Exception as exc:  # status must still answer when logs are not readable
            log.debug("preflight log unavailable: %s", exc)
            return None, None
        start = text.find("{")
        try:
            doc = json.loads(text[start:]) if start >= 0 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return None, None
        decision = str(doc.get("decision"))
        step = doc.get("step") if decision == "resume" else None  # a fresh start reports step 0: no bundle
        return (int(step) if step is not None else None), decision

    def status(self, name: str) -> JobStatus:
        obj = self.get(name)
        st = obj.get("status") or {}
        spec = obj.get("spec") or {}
        step, decision = self.resume_point(st.get("rayClusterName", ""))
        return JobStatus(
            name=name,
            deployment_status=st.get("jobDeploymentStatus", ""),
            job_status=st.get("jobStatus", ""),
            failed=int(st.get("failed") or 0),
            succeeded=int(st.get("succeeded") or 0),
            backoff_limit=int(spec.get("backoffLimit") or 0),
            suspended=bool(spec.get("suspend")),
            cluster=st.get("rayClusterName", ""),
            message=st.get("message", ""),
            resume_step=step,
            resume_decision=decision,
        )

    def wait(self, name: str, timeout: float, poll: float = 5.0) -> JobStatus:
        """Poll until the job reaches a terminal deployment status; ``TimeoutError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            st = self.status(name)
            now = f"{st.deployment_status}/{st.job_status}/{st.failed}"
            if now != last:
                log.info(
                    "rayjob/%s: %s, job %s, retries %d/%d",
                    name,
                    st.deployment_status or "New",
                    st.job_status or "-",
                    st.failed,
                    st.backoff_limit,
                )
                last = now
            if st.finished:
                return st
            if time.monotonic() >= deadline:
                raise TimeoutError(f"rayjob/{name} still {st.deployment_status or 'New'} after {timeout:g}s")
            time.sleep(poll)


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A configured ``ApiClient``: in-cluster service account when available, else kubeconfig."""
    from kubernetes import client, config

    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
                return client.ApiClient()
            except config.ConfigException:
                pass
        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        return client.ApiClient(cfg)
    except (config.ConfigException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K8sError(f"no usable kubeconfig ({first}); set KUBECONFIG or pass --kubeconfig") from None
