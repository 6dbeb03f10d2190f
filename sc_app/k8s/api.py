"""The Kubernetes API server over REST, through the official ``kubernetes`` client's configuration and transport.

Invariants:
- every request has a timeout: ``request_timeout`` seconds, never more than what is left before ``deadline``; it is
  sent once (urllib3's default three silent retries would turn a 30 s timeout into 2 minutes);
- every failure surfaces as ``K8sError``, whose ``str()`` is one line naming the object, the cause and what to do;
  ``transient`` marks the ones a later try may not hit (no answer, unreachable, 429/5xx);
- kinds are resolved through the API server's discovery documents, so any kind the chart renders (CRDs included) is
  handled without a list kept here, and a kind the cluster does not serve is reported before anything is written.
The ``kubernetes`` package is imported here only, and only when a client is built.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from typing import Any
from urllib.parse import quote

from sc_app.k8s.answers import (
    MAX_BODY_BYTES,
    DeadlinePassed,
    K8sError,
    K8sTimeout,
    Resource,
    Response,
    read_body,
    seconds,
    served_kinds,
    transport_error,
)

__all__ = ["MAX_BODY_BYTES", "DeadlinePassed", "K8sError", "K8sTimeout", "Kube", "Resource", "Response", "seconds"]

log = logging.getLogger(__name__)

DEFAULT_REQUEST_TIMEOUT = 30.0
TRANSIENT_STATUS = {429, 500, 502, 503, 504}
# API group → what to do when the cluster does not serve it.
SERVED_BY = {
    "ray.io": "install the KubeRay operator and its CRDs first (ops/README.md, Install)",
    "kueue.x-k8s.io": "install Kueue, or remove its queue label from the release's `labels`",
    "monitoring.coreos.com": "install the Prometheus Operator's CRDs, or turn the monitor off in the values",
}


def ref(obj: dict[str, Any]) -> str:
    """``kind/name`` as kubectl prints it (``configmap/x``)."""
    return f"{obj['kind'].lower()}/{obj['metadata']['name']}"


def explain(resp: Response, what: str, namespace: str) -> K8sError:
    """An error answer of the API server about ``what`` (e.g. ``rayjob/x``) as one line."""
    doc = resp.status_doc() or {}
    lines = resp.text.strip().splitlines()
    message = " ".join((str(doc.get("message") or "").strip() or (lines[0] if lines else "")).split())[:300]
    reason = str(doc.get("reason") or "")
    code = resp.status
    transient = code in TRANSIENT_STATUS
    if code == 404:
        err = f"{what} not found in namespace {namespace}" + (f" ({message})" if message else "")
    elif code == 403:
        err = f"forbidden: {message or what}; ask for RBAC on it in namespace {namespace} (ops/README.md, RBAC)"
    elif code == 401:
        err = f"{what}: unauthorized: the API server rejected your credentials; refresh your kubeconfig"
    elif code == 409 and reason == "AlreadyExists":
        err = f"{what} already exists in namespace {namespace}"
    elif code == 409:
        err = f"{what}: conflict ({message or 'changed concurrently'}); re-read it and retry"
    elif code == 422 or reason == "Invalid":
        err = f"{what} rejected as invalid: {message}"
    elif code == 429:
        err = f"{what}: the API server is throttling requests (429 {message}); retry later"
    else:
        err = f"{what}: API server answered {code} {reason}: {message}".replace("  ", " ").rstrip(": ")
    return K8sError(err, status=code, reason=reason, transient=transient)


class Kube:
    """Requests to one API server on behalf of one namespace. ``api_client``: a configured ``ApiClient``."""

    def __init__(self, api_client: Any, namespace: str, request_timeout: float = DEFAULT_REQUEST_TIMEOUT) -> None:
        self.client = api_client
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.deadline: float | None = None  # time.monotonic() after which no request starts
        self._discovered: dict[str, dict[str, Resource] | None] = {}

    @property
    def host(self) -> str:
        return str(self.client.configuration.host)

    def time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _timeout(self, what: str) -> float:
        left = self.time_left()
        if left is None:
            return self.request_timeout
        if left <= 0:
            raise DeadlinePassed(f"{what}: out of time (the deadline has passed)")
        return min(self.request_timeout, left)

    # ------------------------------------------------------------------ transport
    def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Response:
        """One request; any HTTP answer is returned, no answer is a ``K8sError``."""
        timeout = self._timeout(what)
        hdrs = {"Accept": "application/json, */*", **(headers or {})}
        if body is not None:
            hdrs["Content-Type"] = content_type
        args = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()) or None,
            header_params=hdrs,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            raw = self.client.call_api(*args, _request_timeout=timeout)
        except Exception as exc:
            raise transport_error(exc, what, self.host, timeout) from None
        data = read_body(raw.response, what, self.host, timeout)
        raw.response.release_conn()
        return Response(int(raw.status), data, raw.getheader("content-type") or "")

    def call(self, method: str, path: str, *, what: str, **kwargs: Any) -> dict[str, Any]:
        """A request whose answer must be 2xx JSON; anything else is ``explain``ed."""
        resp = self.request(method, path, what=what, **kwargs)
        if not resp.ok:
            raise explain(resp, what, self.namespace)
        try:
            doc = resp.json()
        except ValueError:
            raise K8sError(f"{what}: the API server answered {resp.status} without JSON") from None
        return doc if isinstance(doc, dict) else {}

    # ------------------------------------------------------------------ discovery
    def resource(self, api_version: str, kind: str) -> Resource:
        """Where ``kind`` of ``api_version`` lives; ``K8sError`` when the cluster does not serve it."""
        if api_version not in self._discovered:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            resp = self.request("GET", path, what=f"discovery of {api_version}")
            if resp.status == 404:
                self._discovered[api_version] = None
            elif not resp.ok:
                raise explain(resp, f"discovery of {api_version}", self.namespace)
            else:
                self._discovered[api_version] = served_kinds(resp, api_version)
        served = self._discovered[api_version]
        if served is None or kind not in served:
            group = api_version.rpartition("/")[0]
            hint = SERVED_BY.get(group, "install the operator or CRD that provides it")
            raise K8sError(f"{kind} objects ({api_version}) are not served by this cluster: {hint}")
        return served[kind]

    def resource_of(self, obj: dict[str, Any]) -> Resource:
        return self.resource(obj["apiVersion"], obj["kind"])

    # ------------------------------------------------------------------ verbs
    def get(self, res: Resource, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        resp = self.request("GET", res.path(self.namespace, name), what=f"{res.kind.lower()}/{name}")
        if resp.status == 404 and (resp.status_doc() or {}).get("reason") == "NotFound":
            return None
        if not resp.ok:
            raise explain(resp, f"{res.kind.lower()}/{name}", self.namespace)
        try:
            doc = resp.json()
        except ValueError:
            raise K8sError(f"{res.kind.lower()}/{name}: the API server answered {resp.status} without JSON") from None
        return doc if isinstance(doc, dict) else None

    def must_get(self, res: Resource, name: str) -> dict[str, Any]:
        obj = self.get(res, name)
        if obj is None:
            raise K8sError(f"{res.kind.lower()}/{name} not found in namespace {self.namespace}", status=404)
        return obj

    def create(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", res.path(self.namespace), what=ref(obj), body=obj)

    def replace(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT the whole object (``metadata.resourceVersion`` set: a concurrent change is a conflict, not lost)."""
        return self.call("PUT", res.path(self.namespace, obj["metadata"]["name"]), what=ref(obj), body=obj)

    def merge_patch(self, res: Resource, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.call(
            "PATCH",
            res.path(self.namespace, name),
            what=f"{res.kind.lower()}/{name}",
            body=patch,
            content_type="application/merge-patch+json",
        )

    def delete(self, res: Resource, name: str, propagation: str = "Background") -> bool:
        """Ask for deletion; False when it was already gone. Finalizers may keep the object a while longer."""
        what = f"{res.kind.lower()}/{name}"
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation}
        resp = self.request("DELETE", res.path(self.namespace, name), what=what, body=body)
        if resp.status == 404 and (resp.status_doc() or {}).get("reason") == "NotFound":
            return False
        if not resp.ok:
            raise explain(resp, what, self.namespace)
        return True

    def list(self, res: Resource, selector: str = "", fields: str = "") -> list[dict[str, Any]]:
        query = {k: v for k, v in (("labelSelector", selector), ("fieldSelector", fields)) if v}
        doc = self.call("GET", res.path(self.namespace), what=f"{res.plural}", query=query or None)
        return [item for item in doc.get("items") or [] if isinstance(item, dict)]

    def pod_log(self, pod: str, container: str) -> str:
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods/{quote(pod, safe='')}/log"
        resp = self.request("GET", path, what=f"pod/{pod} log", query={"container": container})
        if not resp.ok:
            raise explain(resp, f"pod/{pod} log", self.namespace)
        return resp.text

    def proxy_get(self, service: str, port: str, path: str, headers: dict[str, str] | None = None) -> Response:
        """GET ``path`` of ``service:port`` through the API server's service proxy; any answer is returned."""
        url = (
            f"/api/v1/namespaces/{quote(self.namespace, safe='')}/services/"
            f"{quote(service, safe='')}:{quote(port, safe='')}/proxy/{path.lstrip('/')}"
        )
        return self.request("GET", url, what=f"service/{service} proxy", headers=headers)


def load_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A configured ``ApiClient`` that never retries on its own: in-cluster service account when running in a pod
    and neither ``kubeconfig`` nor ``context`` is given, else the kubeconfig. Anything unusable → one-line K8sError."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig is None and context is None:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            pass
        else:
            cfg.retries = False
            return client.ApiClient(cfg)
    source = kubeconfig or "$KUBECONFIG or ~/.kube/config"
    for path in [kubeconfig] if kubeconfig else os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep):
        try:  # the client reads it without a bound: a FIFO there would hang, /dev/zero would never end
            st = os.stat(os.path.expanduser(path))
        except OSError:
            continue  # missing: the client says so in its own words below
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BODY_BYTES:
            why = "cannot read (Is a directory)" if stat.S_ISDIR(st.st_mode) else "not a regular file of at most 64 MiB"
            raise K8sError(f"kubeconfig {path}: {why}; pass --kubeconfig FILE")
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except config.ConfigException as exc:
        text = " ".join(str(exc).split())
        if context and f"name {context} " in text:
            raise K8sError(
                f"kubeconfig {source}: no context named {context!r}{_contexts(config, kubeconfig)}; "
                "pass an existing --context"
            ) from None
        raise K8sError(f"kubeconfig {source}: {text}; set KUBECONFIG or pass --kubeconfig/--context") from None
    except OSError as exc:
        raise K8sError(f"kubeconfig {source}: cannot read ({exc.strerror or exc}); pass --kubeconfig FILE") from None
    except Exception as exc:  # malformed YAML, wrong types, bad base64: the client raises whatever it hits
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise K8sError(
            f"kubeconfig {source}: not a valid kubeconfig ({type(exc).__name__}: {first}); "
            "check it with `kubectl config view`"
        ) from None
    cfg.retries = False
    return client.ApiClient(cfg)


def _contexts(config: Any, kubeconfig: str | None) -> str:
    try:
        contexts, _ = config.list_kube_config_contexts(kubeconfig)
    except Exception:  # the names are a courtesy; the error line stands without them
        return ""
    names = sorted(str(c.get("name")) for c in contexts or [] if isinstance(c, dict))
    return f" (it has: {', '.join(names)})" if names else ""
