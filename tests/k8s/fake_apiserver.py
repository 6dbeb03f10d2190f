"""Tiny HTTP servers on 127.0.0.1 that answer like the Kubernetes API server and like a Ray head's Jobs API.

``FakeApiServer`` follows the API conventions for what ``sc-app k8s`` uses:
- bearer-token authentication (401 ``Status`` without the kubeconfig's token), RBAC per verb and resource (403
  ``Status`` with the API server's message), discovery documents (``/api/v1``, ``/apis/<group>/<version>``; a plain
  ``404 page not found`` for a group the cluster does not serve — a cluster without the KubeRay CRDs);
- create (201, 409 AlreadyExists), get, list with a label selector, replace (PUT, 409 Conflict on a stale
  ``resourceVersion``), merge patch (415 for any other patch type), delete (an object with finalizers only gets a
  ``deletionTimestamp``), pod logs;
- the service proxy ``/api/v1/namespaces/NS/services/NAME[:PORT]/proxy/PATH``: the caller's ``Authorization``
  header is consumed by authentication and not forwarded (as the real API server does); 503 when the service has no
  endpoint or the endpoint refuses; the backend's own answer otherwise, status and body unchanged;
- a stand-in for the KubeRay operator's RayJob finalizer (``ray.io/rayjob-finalizer``, rayjob_controller.go @feeaf72):
  added on create; on deletion of a job that is not terminal it must read the auth Secret to stop the Ray job, and
  without the Secret it keeps the finalizer for ever (recorded in ``stuck``).

``FakeRayJobsApi`` answers ``GET /api/jobs/<id>`` and ``/api/jobs/<id>/logs`` with Ray 2.60's shapes
(``JobDetails`` and ``JobLogsResponse``) behind Ray's token middleware (``Authorization``, then
``X-Ray-Authorization``, then the cookie; 401 without a token, 403 with a wrong one).
"""

from __future__ import annotations

import base64
import json
import logging
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "test-token"  # the kubeconfig user's bearer token
FINALIZER = "ray.io/rayjob-finalizer"
TERMINAL_JOB_STATUS = {"SUCCEEDED", "FAILED", "STOPPED"}
# group/version → plural → (kind, namespaced). Subresources are listed the way discovery lists them.
SERVED: dict[str, dict[str, tuple[str, bool]]] = {
    "v1": {
        "configmaps": ("ConfigMap", True),
        "secrets": ("Secret", True),
        "serviceaccounts": ("ServiceAccount", True),
        "persistentvolumeclaims": ("PersistentVolumeClaim", True),
        "pods": ("Pod", True),
        "pods/log": ("Pod", True),
        "services": ("Service", True),
        "services/proxy": ("ServiceProxyOptions", True),
        "namespaces": ("Namespace", False),
        "events": ("Event", True),
    },
    "storage.k8s.io/v1": {"storageclasses": ("StorageClass", False)},
    "networking.k8s.io/v1": {"networkpolicies": ("NetworkPolicy", True)},
    "ray.io/v1": {"rayjobs": ("RayJob", True), "rayclusters": ("RayCluster", True)},
}
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}


def status_body(code: int, reason: str, message: str, name: str = "", plural: str = "", group: str = "") -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {"name": name, "group": group, "kind": plural},
        "code": code,
    }


log = logging.getLogger(__name__)


class QuietHTTPServer(ThreadingHTTPServer):
    """Errors go to logging, not to stderr (which a test reading the CLI's one error line captures too); a client
    that hung up first (its own timeout) is what a real server sees as well, and not an error of the stand-in."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("client %s hung up before the answer was written", client_address)
            return
        log.exception("fake API server: the request from %s failed", client_address)


class _Server:
    """A threaded HTTP server whose handler calls ``self.answer``; ``start()`` returns its URL."""

    def start(self) -> str:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                code, body, ctype = owner.answer(self.command, self.path, dict(self.headers.items()), raw)
                data = body if isinstance(body, bytes) else body.encode() if isinstance(body, str) else json.dumps(
                    body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        """Stop serving (idempotent): the port then refuses connections."""
        httpd, self._httpd = getattr(self, "_httpd", None), None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any, str]:
        raise NotImplementedError


@dataclass
class FakeApiServer(_Server):
    """State + switches; ``store[(plural, ns, name)]`` holds objects as JSON-able dicts."""

    serve_rayjobs: bool = True
    extra_groups: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)  # more CRDs served
    forbidden_user: str | None = None  # every request is forbidden for this user
    denied: set[tuple[str, str]] = field(default_factory=set)  # (verb, resource) RBAC does not grant
    kuberay_running: bool = True
    store: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (ns, pod, container) → text
    endpoints: dict[tuple[str, str], str] = field(default_factory=dict)  # (ns, service) → backend base URL
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, content-type)
    rayjob_status_script: list[dict[str, Any]] = field(default_factory=list)  # popped on each RayJob GET
    stuck: list[str] = field(default_factory=list)  # RayJobs whose finalizer could not stop the Ray job
    kuberay_suspends: bool = False  # act on spec.suspend like KubeRay (see _suspend_tick)
    terminating_ticks: int = 3  # requests a deleted pod stays listed (its preStop hook running)
    controllers: list[Any] = field(default_factory=list)  # more stand-ins: called as c(self) after each request
    _rv: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def served(self) -> dict[str, dict[str, tuple[str, bool]]]:
        groups = {gv: r for gv, r in SERVED.items() if gv != "ray.io/v1" or self.serve_rayjobs}
        return groups | self.extra_groups

    def add(self, plural: str, obj: dict[str, Any], ns: str = "ml") -> dict[str, Any]:
        """Put an object into the store as if it had been created (resourceVersion, uid)."""
        self._rv += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", ns)
        meta.setdefault("uid", f"uid-{self._rv}")
        meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{self._rv % 60:02d}Z")
        meta["resourceVersion"] = str(self._rv)
        self.store[(plural, ns, meta["name"])] = obj
        return obj

    # ------------------------------------------------------------------ routing
    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any, str]:
        headers = {k.lower(): v for k, v in headers.items()}
        with self._lock:
            url = urllib.parse.urlsplit(path)
            ctype = headers.get("content-type", "")
            self.requests.append((method, url.path, ctype))
            if headers.get("authorization") != f"Bearer {TOKEN}":
                return 401, status_body(401, "Unauthorized", "Unauthorized"), "application/json"
            try:
                return self._route(method, url.path, urllib.parse.parse_qs(url.query), raw, ctype, headers)
            finally:
                self._operator_tick()

    def _route(self, method: str, path: str, query: dict[str, list[str]], raw: bytes, ctype: str,
               headers: dict[str, str]) -> tuple[int, Any, str]:
        parts = [urllib.parse.unquote(p) for p in path.split("/") if p]
        not_served = (404, "404 page not found\n", "text/plain; charset=utf-8")
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return not_served
        resources = self.served().get(gv)
        if resources is None:
            return not_served
        if not rest:  # discovery: allowed for every authenticated user (system:discovery)
            listed = [{"name": p, "singularName": "", "namespaced": ns, "kind": k, "verbs": ["get"]}
                      for p, (k, ns) in resources.items()]
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                         "resources": listed}, "application/json"
        if rest[0] == "namespaces" and len(rest) >= 3:
            ns, plural, tail = rest[1], rest[2], rest[3:]
        elif rest[0] in resources and not resources[rest[0]][1]:  # cluster-scoped (StorageClass)
            ns, plural, tail = "", rest[0], rest[1:]
        else:
            return not_served
        if plural not in resources:
            return not_served
        group = gv.rpartition("/")[0]
        name = tail[0] if tail else ""
        sub = tail[1] if len(tail) > 1 else ""
        verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
                "DELETE": "delete"}[method]
        if plural == "services" and sub == "proxy":
            name, _, port = name.partition(":")
        resource = f"{plural}/{sub}" if sub else plural
        denied = self.forbidden_user or ((verb, resource) in self.denied and "system:serviceaccount:ml:ci")
        if denied:
            qualified = f"{resource}.{group}" if group else resource
            target = f'{qualified} "{name}" is forbidden' if name else f"{qualified} is forbidden"
            msg = (f'{target}: User "{denied}" cannot {verb} resource "{resource}" in API group "{group}" in the '
                   f'namespace "{ns}"')
            return 403, status_body(403, "Forbidden", msg, name, plural, group), "application/json"
        if plural == "services" and sub == "proxy":
            return self._proxy(ns, name, port, "/" + "/".join(tail[2:]), query, headers)
        if plural == "pods" and sub == "log":
            text = self.logs.get((ns, name, query.get("container", [""])[0]))
            if text is None:
                return 404, status_body(404, "NotFound", f'pods "{name}" not found', name, plural), "application/json"
            return 200, text, "text/plain"
        qualified = f"{plural}.{group}" if group else plural
        if method == "POST":
            obj = json.loads(raw)
            obj_name = obj["metadata"]["name"]
            if (plural, ns, obj_name) in self.store:
                msg = f'{qualified} "{obj_name}" already exists'
                return 409, status_body(409, "AlreadyExists", msg, obj_name, plural, group), "application/json"
            if plural == "rayjobs" and self.kuberay_running:
                obj["metadata"].setdefault("finalizers", []).append(FINALIZER)
            return 201, self.add(plural, obj, ns), "application/json"
        if method == "GET" and not name:
            selector = dict(s.split("=", 1) for s in query.get("labelSelector", [""])[0].split(",") if s)
            fields = dict(s.split("=", 1) for s in query.get("fieldSelector", [""])[0].split(",") if s)
            items = [o for (p, n, _), o in self.store.items() if p == plural and n == ns
                     and selector.items() <= (o["metadata"].get("labels") or {}).items()
                     and all(_field(o, k) == v for k, v in fields.items())]
            kind = resources[plural][0]
            return 200, {"kind": f"{kind}List", "apiVersion": gv, "metadata": {}, "items": items}, "application/json"
        key = (plural, ns, name)
        if key not in self.store:
            msg = f'{qualified} "{name}" not found'
            return 404, status_body(404, "NotFound", msg, name, plural, group), "application/json"
        obj = self.store[key]
        if method == "GET":
            if plural == "rayjobs" and self.rayjob_status_script:
                obj["status"] = self.rayjob_status_script.pop(0)
            return 200, obj, "application/json"
        if method == "PUT":
            new = json.loads(raw)
            if new["metadata"].get("resourceVersion") != obj["metadata"]["resourceVersion"]:
                msg = (f'Operation cannot be fulfilled on {qualified} "{name}": the object has been modified; please '
                       "apply your changes to the latest version and try again")
                return 409, status_body(409, "Conflict", msg, name, plural, group), "application/json"
            new["metadata"].update(uid=obj["metadata"]["uid"], creationTimestamp=obj["metadata"]["creationTimestamp"])
            return 200, self.add(plural, new, ns), "application/json"
        if method == "PATCH":
            if not ctype.startswith("application/merge-patch+json"):
                msg = f"the body of the request was in an unknown format - accepted media types include: {ctype!r}"
                return 415, status_body(415, "UnsupportedMediaType", msg, name, plural, group), "application/json"
            _merge_patch(obj, json.loads(raw))
            return 200, self.add(plural, obj, ns), "application/json"
        if method == "DELETE":
            if obj["metadata"].get("finalizers"):
                obj["metadata"].setdefault("deletionTimestamp", "2026-01-01T01:00:00Z")
                return 200, obj, "application/json"
            self._remove(key)
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": group, "kind": plural}}, "application/json"
        return 405, status_body(405, "MethodNotAllowed", "method not allowed"), "application/json"

    def _proxy(self, ns: str, service: str, port: str, path: str, query: dict[str, list[str]],
               headers: dict[str, str]) -> tuple[int, Any, str]:
        svc = self.store.get(("services", ns, service))
        if svc is None:
            return 404, status_body(404, "NotFound", f'services "{service}" not found', service, "services"), \
                "application/json"
        ports = svc.get("spec", {}).get("ports", [])
        if port and not any(port in (p.get("name"), str(p.get("port"))) for p in ports):
            msg = f'no endpoints available for service "{service}:{port}"'
            return 503, status_body(503, "ServiceUnavailable", msg), "application/json"
        backend = self.endpoints.get((ns, service))
        if backend is None:
            msg = f'no endpoints available for service "{service}"'
            return 503, status_body(503, "ServiceUnavailable", msg), "application/json"
        forward = {k: v for k, v in headers.items()
                   if k.lower() not in HOP_BY_HOP | {"authorization", "host", "content-length"}}
        url = backend + path + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=forward), timeout=10) as resp:
                return resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as err:
            return err.code, err.read(), err.headers.get("Content-Type", "")
        except OSError as err:
            hostport = urllib.parse.urlsplit(backend).netloc
            msg = f"error trying to reach service: dial tcp {hostport}: connect: {getattr(err, 'reason', err)}"
            return 503, status_body(503, "ServiceUnavailable", msg), "application/json"

    def _remove(self, key: tuple[str, str, str]) -> None:
        """Delete ``key``; a RayJob takes what KubeRay created for it along (garbage collection by owner)."""
        obj = self.store.pop(key)
        if key[0] == "rayjobs":
            cluster = (obj.get("status") or {}).get("rayClusterName")
            for k in [k for k, o in self.store.items() if cluster and k[1] == key[1]
                      and (o["metadata"].get("labels") or {}).get("ray.io/cluster") == cluster]:
                del self.store[k]

    def _suspend_tick(self) -> None:
        """KubeRay's suspension (rayjob_controller.go): Running → Suspending; then it deletes the RayCluster and says
        Suspended (clearing rayClusterName) while the cluster's pods are still terminating (preStop hooks); they go
        ``terminating_ticks`` requests later."""
        for key, obj in list(self.store.items()):
            meta = obj["metadata"]
            if key[0] == "pods" and meta.get("deletionTimestamp"):
                meta["_ticks"] = meta.get("_ticks", 0) + 1
                if meta["_ticks"] > self.terminating_ticks:
                    del self.store[key]
            if key[0] != "rayjobs":
                continue
            st = obj.setdefault("status", {})
            if not (obj.get("spec") or {}).get("suspend"):
                if st.get("jobDeploymentStatus") == "Suspended":  # resumed: a new cluster (a new attempt)
                    st.update(jobDeploymentStatus="Initializing", rayClusterName=f"{key[2]}-r{self._rv}")
                continue
            if st.get("jobDeploymentStatus") in ("Running", "Initializing", "Retrying"):
                st["jobDeploymentStatus"] = "Suspending"
            elif st.get("jobDeploymentStatus") == "Suspending":
                for pod in self.store.values():
                    if pod.get("kind") == "Pod" and (pod["metadata"].get("labels") or {}).get(
                            "ray.io/cluster") == st.get("rayClusterName"):
                        pod["metadata"].setdefault("deletionTimestamp", "2026-01-01T02:00:00Z")
                st.update(jobDeploymentStatus="Suspended", rayClusterName="", jobId="")

    def _operator_tick(self) -> None:
        """KubeRay's reaction to a deleted RayJob: stop the Ray job (needs the auth Secret), drop the finalizer."""
        if not self.kuberay_running:
            return
        for controller in self.controllers:
            controller(self)
        if self.kuberay_suspends:
            self._suspend_tick()
        for key, job in list(self.store.items()):
            meta = job["metadata"]
            if key[0] != "rayjobs" or not meta.get("deletionTimestamp") or FINALIZER not in meta.get("finalizers", []):
                continue
            status = job.get("status") or {}
            auth = (job.get("spec", {}).get("rayClusterSpec") or {}).get("authOptions") or {}
            secret = auth.get("secretName") or status.get("rayClusterName", "")
            if (status.get("jobStatus") not in TERMINAL_JOB_STATUS and auth.get("mode") == "token"
                    and ("secrets", key[1], secret) not in self.store):
                if key[2] not in self.stuck:
                    self.stuck.append(key[2])  # "failed to get auth secret": requeued, finalizer kept
                continue
            meta["finalizers"] = [f for f in meta["finalizers"] if f != FINALIZER]
            if not meta["finalizers"]:
                self._remove(key)


def _field(obj: dict[str, Any], path: str) -> str:
    """A field selector's value (``involvedObject.name``) of ``obj``."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def _merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge_patch(target[k], v)
        else:
            target[k] = v


@dataclass
class FakeRayJobsApi(_Server):
    """A Ray head's Jobs API (Ray 2.60 shapes) behind Ray's token middleware; ``seen`` records request headers."""

    token: str | None = None
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # submission id → JobDetails fields
    driver_logs: dict[str, str] = field(default_factory=dict)  # submission id → driver output
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def add_job(self, submission_id: str, status: str, logs: str, entrypoint: str = "sc-app run") -> None:
        self.jobs[submission_id] = {
            "type": "SUBMISSION", "job_id": "02000000", "submission_id": submission_id,
            "driver_info": {"id": "02000000", "node_ip_address": "10.0.0.5", "pid": "4242"},
            "status": status, "entrypoint": entrypoint, "message": f"Job is currently {status.lower()}.",
            "error_type": None, "start_time": 1767225600000, "end_time": None, "metadata": {}, "runtime_env": {},
            "driver_agent_http_address": "http://10.0.0.5:52365", "driver_node_id": "ab" * 28,
            "driver_exit_code": None,
        }
        self.driver_logs[submission_id] = logs

    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, Any, str]:
        lower = {k.lower(): v for k, v in headers.items()}
        self.seen.append((path, lower))
        if self.token is not None:
            auth = lower.get("authorization") or lower.get("x-ray-authorization", "")
            if not auth:
                cookie = dict(c.strip().split("=", 1) for c in lower.get("cookie", "").split(";") if "=" in c)
                auth = f"Bearer {cookie['ray-authentication-token']}" if "ray-authentication-token" in cookie else ""
            if not auth:
                return 401, "Unauthorized: Missing authentication token", "text/plain; charset=utf-8"
            if auth != f"Bearer {self.token}":
                return 403, "Forbidden: Invalid authentication token", "text/plain; charset=utf-8"
        parts = [p for p in urllib.parse.urlsplit(path).path.split("/") if p]
        if method != "GET" or parts[:2] != ["api", "jobs"] or len(parts) not in (3, 4):
            return 404, "404: Not Found", "text/plain; charset=utf-8"
        job_id = urllib.parse.unquote(parts[2])
        if job_id not in self.jobs:
            return 404, f"Job {job_id} does not exist", "text/plain; charset=utf-8"
        if len(parts) == 4:
            if parts[3] != "logs":
                return 404, "404: Not Found", "text/plain; charset=utf-8"
            return 200, {"logs": self.driver_logs[job_id]}, "application/json"
        return 200, self.jobs[job_id], "application/json"


def auth_secret(name: str, token: str, release: str = "demo") -> dict[str, Any]:
    """The chart's Ray auth Secret as it exists in the cluster."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/instance": release}},
            "data": {"auth_token": base64.b64encode(token.encode()).decode()}}


def write_kubeconfig(path: str, server: str, namespace: str = "ml") -> None:
    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": TOKEN}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        "current-context": "fake",
    }
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
