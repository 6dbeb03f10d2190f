"""The read side of a Kubernetes API server, just enough for Helm's ``lookup`` during a cluster-aware render.

Helm resolves ``lookup "ray.io/v1" "RayJob" ns name`` through discovery (``GET /api/v1`` or ``GET /apis/<group>/
<version>`` to map the kind to its resource and scope) and then ``GET .../namespaces/<ns>/<plural>/<name>``. This
server answers both from ``objects`` and answers 404 with a ``Status`` body for anything else, like the real one.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.k8s.fake_apiserver import QuietHTTPServer

# kind → (plural, group/version) for what the chart looks up.
RESOURCES: dict[str, tuple[str, str]] = {
    "Secret": ("secrets", "v1"),
    "ConfigMap": ("configmaps", "v1"),  # kube-root-ca.crt: in every namespace of a real cluster
    "PersistentVolumeClaim": ("persistentvolumeclaims", "v1"),
    "RayJob": ("rayjobs", "ray.io/v1"),
}


def _not_found(path: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "NotFound",
            "message": f"{path} not found", "code": 404}


@dataclass
class LookupApiServer:
    """``objects``: live objects (apiVersion, kind, metadata.name/namespace); ``gets``: the paths read."""

    objects: list[dict[str, Any]] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)

    def _discovery(self, group_version: str) -> dict[str, Any]:
        resources = [{"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
                      "verbs": ["get", "list"]}
                     for kind, (plural, gv) in RESOURCES.items() if gv == group_version]
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        self.gets.append(path)
        if path == "/api/v1":
            return 200, self._discovery("v1")
        if path.startswith("/apis/") and path.count("/") == 3:
            return 200, self._discovery(path.removeprefix("/apis/"))
        for obj in self.objects:
            plural, gv = RESOURCES[obj["kind"]]
            prefix = "/api/v1" if gv == "v1" else f"/apis/{gv}"
            meta = obj["metadata"]
            if path == f"{prefix}/namespaces/{meta['namespace']}/{plural}/{meta['name']}":
                return 200, obj
        return 404, _not_found(path)

    def start(self) -> str:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                code, body = server.answer(self.path.split("?")[0])
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
