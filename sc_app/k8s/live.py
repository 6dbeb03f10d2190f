"""The running attempt as its Ray head sees it: the Ray Jobs API, reached through the API server's service proxy.

Facts this relies on (KubeRay ``ray-operator`` @feeaf72, Ray 2.60):
- ``RayJob.status.jobId`` is the Ray submission id of the current attempt (KubeRay clears it and makes a new one for
  every retry); ``status.dashboardURL`` is ``<head service>.<namespace>.svc.<domain>:<port>`` of the current cluster;
  without it the head service is ``<status.rayClusterName>-head-svc`` (``utils.GenerateHeadServiceName``) with the
  dashboard port named ``dashboard`` — the path KubeRay's own dashboard client takes through the proxy.
- With ``authOptions.mode: token`` the dashboard reads the token from ``Authorization: Bearer``, else from
  ``X-Ray-Authorization: Bearer``, else from a cookie (``ray/_private/authentication/http_token_authentication.py``):
  401 without a token, 403 for a wrong one. The API server authenticates the caller by the ``Authorization`` header
  and removes it before proxying (kubernetes/kubernetes#38775), so the token is sent as ``X-Ray-Authorization``: Ray
  added that fallback for this very path (ray-project/ray#58819) and KubeRay's dashboard client sends it through the
  proxy (ray-project/kuberay#4213). It is the ``auth_token`` key of ``authOptions.secretName`` (default: a Secret
  named after the RayCluster).
- ``GET /api/jobs/<id>`` answers the job's details (JSON with ``status``, ``message``, ``start_time``...);
  ``GET /api/jobs/<id>/logs`` answers ``{"logs": "<the driver's whole output>"}`` (about 100 bytes per step).

Invariant: the token is never printed or logged; any failure is ``LiveUnavailable`` with one line saying what to do.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from sc_app.io import strict_json
from sc_app.k8s.api import K8sError, Kube, Response
from sc_app.k8s.driver_log import DriverProgress, parse

TOKEN_KEY = "auth_token"  # KubeRay's RAY_AUTH_TOKEN_SECRET_KEY
# Longest wait for the proxy when a NetworkPolicy looks like it drops the API server's connection to the head: an
# enforcing CNI drops it silently and the API server would only answer after its own dial timeout.
BLOCKED_PROBE_S = 5.0
POLICY_HINT = "ops/README.md, NetworkPolicy and the API server's proxy"
TOKEN_HEADER = "X-Ray-Authorization"  # Ray's fallback header: survives the API server proxy
RBAC_HINT = "ops/README.md, RBAC for sc-app k8s"


class LiveUnavailable(Exception):
    """The live part of the status cannot be read; ``str()`` is one line."""


@dataclass
class LiveStatus:
    """The current attempt's Ray job and what its driver printed so far."""

    job_id: str
    ray_status: str
    message: str
    progress: DriverProgress

    def as_dict(self) -> dict[str, Any]:
        return {"jobId": self.job_id, "rayStatus": self.ray_status, "message": self.message} | self.progress.as_dict()

    def lines(self) -> list[str]:
        p = self.progress
        step = (
            f"step {p.step}/{p.max_steps}" if p.step is not None and p.max_steps else "no train step reported yet"
        )
        if p.newest_bundle_source == "saved":
            bundle = f"newest bundle step_{p.newest_bundle_step} (saved by this attempt)"
        elif p.newest_bundle_source == "resumed":
            bundle = f"newest bundle step_{p.newest_bundle_step} (resumed from; none saved by this attempt yet)"
        else:
            bundle = "no bundle yet" + (" (fresh start)" if p.fresh_start else "")
        out = [f"live: ray job {self.job_id} {self.ray_status}: {step}, {bundle}"]
        if p.goodput_line:
            out.append(f"attempt {p.goodput_line}")
        if p.events:
            out.append("last events:")
            out += [f"  {e.line}" for e in p.events]
        return out


def _endpoint(rayjob: dict[str, Any]) -> tuple[str, str]:
    """(head service, dashboard port) of the RayJob's current cluster."""
    st = rayjob.get("status") or {}
    url = str(st.get("dashboardURL") or "")
    host, _, port = url.removeprefix("http://").partition(":")
    if host and port:
        return host.split(".")[0], port.split("/")[0]
    service = ((st.get("rayClusterStatus") or {}).get("head") or {}).get("serviceName")
    return service or f"{st['rayClusterName']}-head-svc", "dashboard"


def _token(kube: Kube, rayjob: dict[str, Any]) -> str | None:
    """The Ray auth token of the RayJob's cluster, or None when token auth is off."""
    spec = rayjob.get("spec") or {}
    auth = (spec.get("rayClusterSpec") or {}).get("authOptions") or {}
    if auth.get("mode") != "token":
        return None
    name = auth.get("secretName") or (rayjob.get("status") or {}).get("rayClusterName", "")
    try:
        secret = kube.get(kube.resource("v1", "Secret"), name)
    except K8sError as exc:
        raise LiveUnavailable(f"cannot read the Ray auth token from secret/{name}: {exc}") from None
    if secret is None:
        raise LiveUnavailable(f"secret/{name} with the Ray auth token not found in namespace {kube.namespace}")
    encoded = (secret.get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        raise LiveUnavailable(f"secret/{name} has no {TOKEN_KEY} key: the Ray dashboard cannot be asked")
    try:
        return base64.b64decode(encoded).decode().strip()
    except ValueError:
        raise LiveUnavailable(f"secret/{name}: {TOKEN_KEY} is not base64") from None


def _refusal(resp: Response, service: str, job_id: str, namespace: str) -> str:
    """One line for an answer that is not the Ray job's data."""
    doc = resp.status_doc()
    if doc is not None:  # the API server answered, not Ray
        message = " ".join(str(doc.get("message") or "").split())
        if resp.status == 403:
            return f"forbidden: {message}; needs get on services/proxy in namespace {namespace} ({RBAC_HINT})"
        if resp.status == 404:
            return f"head service {service} not found (the cluster is not up yet, or was removed): {message}"
        if resp.status in (502, 503):
            return f"the head is not reachable through service/{service} (it may be starting): {message}"
        return f"the API server answered {resp.status} for service/{service}: {message}"
    body = " ".join(resp.text.split())[:200]
    if resp.status == 401:
        return f"the Ray dashboard asked for a token ({body}); token authentication is on but no token was sent"
    if resp.status == 403:
        return f"the Ray dashboard refused the token ({body}); the auth Secret does not match the cluster's token"
    if resp.status == 404:
        return f"Ray has no job {job_id} (yet): the submitter may not have submitted it ({body})"
    return f"the Ray dashboard answered {resp.status}: {body}"


def live_status(kube: Kube, rayjob: dict[str, Any], *, last_events: int = 5) -> LiveStatus:
    """Ask the current attempt's head for its Ray job and driver output; ``LiveUnavailable`` with one line if not."""
    st = rayjob.get("status") or {}
    job_id = str(st.get("jobId") or "")
    if not job_id or not st.get("rayClusterName"):
        state = st.get("jobDeploymentStatus") or "New"
        raise LiveUnavailable(f"no running attempt to ask (deployment status {state})")
    service, port = _endpoint(rayjob)
    token = _token(kube, rayjob)
    headers = {TOKEN_HEADER: f"Bearer {token}"} if token else {}
    blocker = policy_blocking_proxy(kube, rayjob, port)
    blocked = (
        f"the API server's proxy cannot reach the head: networkpolicy/{blocker} admits the dashboard port only from "
        f"namespaces, not from the control plane; add its CIDR to networkPolicy.apiServerCIDRs ({POLICY_HINT})"
    )

    def ask(path: str) -> Any:
        saved = kube.request_timeout
        if blocker:
            kube.request_timeout = min(saved, BLOCKED_PROBE_S)
        try:
            resp = kube.proxy_get(service, port, path, headers=headers)
        except K8sError as exc:
            raise LiveUnavailable(blocked if blocker else str(exc)) from None
        finally:
            kube.request_timeout = saved
        if not resp.ok:
            if blocker and resp.status in (502, 503, 504):
                raise LiveUnavailable(blocked)
            raise LiveUnavailable(_refusal(resp, service, job_id, kube.namespace))
        try:
            return strict_json.parse(resp.body)
        except ValueError:
            raise LiveUnavailable(f"the Ray dashboard answered {path} without JSON") from None

    details = ask(f"api/jobs/{quote(job_id, safe='')}")
    logs = ask(f"api/jobs/{quote(job_id, safe='')}/logs")
    if not isinstance(details, dict) or not isinstance(logs, dict):
        raise LiveUnavailable("the Ray Jobs API answered in an unexpected shape")
    return LiveStatus(
        job_id=job_id,
        ray_status=str(details.get("status") or "UNKNOWN"),
        message=str(details.get("message") or ""),
        progress=parse(str(logs.get("logs") or ""), last_events=last_events),
    )


def policy_blocking_proxy(kube: Kube, rayjob: dict[str, Any], port: str) -> str | None:
    """The name of a NetworkPolicy that selects the head and admits its dashboard port from no address block (so
    not from the API server's proxy), or None; None too when policies cannot be read."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    labels = ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}
    try:
        policies = kube.list(kube.resource("networking.k8s.io/v1", "NetworkPolicy"))
    except K8sError:
        return None
    for policy in policies:
        spec = policy.get("spec") or {}
        selector = spec.get("podSelector") or {}
        if selector.get("matchExpressions") or not (selector.get("matchLabels") or {}).items() <= labels.items():
            continue
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            continue
        if not any(_admits_addresses(rule, port) for rule in spec.get("ingress") or []):
            return str((policy.get("metadata") or {}).get("name") or "?")
    return None


def _admits_addresses(rule: dict[str, Any], port: str) -> bool:
    """Whether an ingress rule lets an address outside the cluster's pods (an ipBlock, or any source) reach ``port``
    (a number, or the port's name)."""
    ports = rule.get("ports") or []
    if ports and not any(str(p.get("port")) in (port, "dashboard") or p.get("port") is None for p in ports):
        return False
    peers = rule.get("from") or []
    return not peers or any("ipBlock" in peer or _konnectivity(peer) for peer in peers)


def _konnectivity(peer: dict[str, Any]) -> bool:
    """A peer selecting the konnectivity-agent pods, through which GKE's and AKS's API servers reach pods."""
    labels = ((peer.get("podSelector") or {}).get("matchLabels") or {}).values()
    return "konnectivity-agent" in labels
