"""A tiny HTTP server on 127.0.0.1 that answers like the Kubernetes API server for what ``sc-app k8s`` uses.

Follows the API conventions: JSON ``Status`` bodies with ``reason``/``code`` for errors (404 NotFound, 409
AlreadyExists, 403 Forbidden, 415 for a non-merge-patch PATCH), 201 on create, a plain-text ``404 page not found``
for a group/version the server does not serve (what a cluster without the KubeRay CRDs answers).
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PLURAL_KIND = {
    "rayjobs": ("ray.io", "RayJob"),
    "configmaps": ("", "ConfigMap"),
    "secrets": ("", "Secret"),
    "serviceaccounts": ("", "ServiceAccount"),
    "persistentvolumeclaims": ("", "PersistentVolumeClaim"),
    "networkpolicies": ("networking.k8s.io", "NetworkPolicy"),
    "pods": ("", "Pod"),
}


def status_body(code: int, reason: str, message: str, name: str = "", plural: str = "") -> dict[str, Any]:
    group = PLURAL_KIND.get(plural, ("", ""))[0]
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


def _qualified(plural: str) -> str:
    group = PLURAL_KIND.get(plural, ("", ""))[0]
    return f"{plural}.{group}" if group else plural


@dataclass
class FakeApiServer:
    """State + switches; ``store[(plural, ns, name)]`` holds objects as JSON-able dicts."""

    serve_rayjobs: bool = True
    forbidden_user: str | None = None
    store: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    logs: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (ns, pod, container) → text
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (method, path, content-type)
    rayjob_status_script: list[dict[str, Any]] = field(default_factory=list)  # popped on each RayJob GET
    _rv: int = 0

    def start(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urllib.parse.urlsplit(self.path)
                server.requests.append((method, url.path, self.headers.get("Content-Type", "")))
                code, body, ctype = server.answer(method, url.path, urllib.parse.parse_qs(url.query), raw,
                                                  self.headers.get("Content-Type", ""))
                self._send(code, body, ctype)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

            def do_DELETE(self) -> None:
                self._handle("DELETE")

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # ------------------------------------------------------------------ routing
    def answer(self, method: str, path: str, query: dict[str, list[str]], raw: bytes, ctype: str
               ) -> tuple[int, Any, str]:
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"]:
            rest = parts[2:]  # api/v1/...
        elif parts[:1] == ["apis"]:
            if parts[1] == "ray.io" and not self.serve_rayjobs:
                return 404, "404 page not found\n", "text/plain; charset=utf-8"
            rest = parts[3:]  # apis/group/version/...
        else:
            return 404, "404 page not found\n", "text/plain; charset=utf-8"
        if len(rest) < 3 or rest[0] != "namespaces":
            return 404, "404 page not found\n", "text/plain; charset=utf-8"
        ns, plural = rest[1], rest[2]
        name = rest[3] if len(rest) > 3 else ""
        sub = rest[4] if len(rest) > 4 else ""
        verb = {"GET": "get" if name else "list", "POST": "create", "PATCH": "patch", "DELETE": "delete"}[method]
        if self.forbidden_user:
            target = f'{_qualified(plural)} "{name}" is forbidden' if name else f"{_qualified(plural)} is forbidden"
            msg = (f'{target}: User "{self.forbidden_user}" cannot {verb} resource "{plural}" in API group '
                   f'"{PLURAL_KIND.get(plural, ("", ""))[0]}" in the namespace "{ns}"')
            return 403, status_body(403, "Forbidden", msg, name, plural), "application/json"
        if plural == "pods" and sub == "log":
            text = self.logs.get((ns, name, query.get("container", [""])[0]))
            if text is None:
                return 404, status_body(404, "NotFound", f'pods "{name}" not found', name, plural), "application/json"
            return 200, text, "text/plain"
        if method == "POST":
            obj = json.loads(raw)
            obj_name = obj["metadata"]["name"]
            key = (plural, ns, obj_name)
            if key in self.store:
                msg = f'{_qualified(plural)} "{obj_name}" already exists'
                return 409, status_body(409, "AlreadyExists", msg, obj_name, plural), "application/json"
            self._rv += 1
            obj["metadata"].update(namespace=ns, uid=f"uid-{self._rv}", resourceVersion=str(self._rv),
                                   creationTimestamp="2026-01-01T00:00:00Z")
            self.store[key] = obj
            return 201, obj, "application/json"
        if method == "GET" and not name:
            selector = dict(s.split("=", 1) for s in query.get("labelSelector", [""])[0].split(",") if s)
            items = [o for (p, n, _), o in self.store.items() if p == plural and n == ns
                     and selector.items() <= (o["metadata"].get("labels") or {}).items()]
            kind = PLURAL_KIND[plural][1]
            return 200, {"kind": f"{kind}List", "apiVersion": "v1", "metadata": {}, "items": items}, "application/json"
        key = (plural, ns, name)
        if key not in self.store:
            msg = f'{_qualified(plural)} "{name}" not found'
            return 404, status_body(404, "NotFound", msg, name, plural), "application/json"
        obj = self.store[key]
        if method == "GET":
            if plural == "rayjobs" and self.rayjob_status_script:
                step = self.rayjob_status_script.pop(0)
                obj["status"] = step
            return 200, obj, "application/json"
        if method == "PATCH":
            if not ctype.startswith("application/merge-patch+json"):
                msg = f"the body of the request was in an unknown format - accepted media types include: {ctype!r}"
                return 415, status_body(415, "UnsupportedMediaType", msg, name, plural), "application/json"
            _merge_patch(obj, json.loads(raw))
            self._rv += 1
            obj["metadata"]["resourceVersion"] = str(self._rv)
            return 200, obj, "application/json"
        if method == "DELETE":
            del self.store[key]
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": PLURAL_KIND[plural][0], "kind": plural}}, "application/json"
        return 405, status_body(405, "MethodNotAllowed", "method not allowed"), "application/json"


def _merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386 JSON merge patch."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            _merge_patch(target[k], v)
        else:
            target[k] = v


def write_kubeconfig(path: str, server: str, namespace: str = "ml") -> None:
    import yaml

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "test-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester", "namespace": namespace}}],
        "current-context": "fake",
    }
    with open(path, "w") as fh:
        yaml.safe_dump(doc, fh)
