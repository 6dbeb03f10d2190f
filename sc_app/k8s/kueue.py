"""Kueue's Workload of a queued RayJob: found by owner, suspended and resumed through its ``spec.active``.

Why not ``spec.suspend`` alone: Kueue's job reconciler unsuspends a suspended job whose Workload is still admitted
("Job admitted, unsuspending"), so a plain suspend is undone within seconds and a resume that writes
``suspend: false`` starts pods on quota Kueue has not granted (it then suspends them again). A Workload with
``spec.active: false`` is evicted (reason Deactivated), its quota released, and the job is suspended by Kueue itself
and stays so until the Workload is active again and re-admitted.

Invariants: only Workloads whose ``ownerReferences`` name the RayJob (uid, or kind and name) are touched; a RayJob
without the queue label never reads Kueue's API; a queued RayJob whose Workload cannot be found is one line, with
nothing written.
"""

from __future__ import annotations

from typing import Any

from sc_app.k8s.api import K8sError, Kube, Resource

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Newest first: Kueue serves v1beta2 since 0.15 and v1beta1 before (and beside it); spec.active is in both.
WORKLOAD_VERSIONS = ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta1")


def queue_of(rayjob: dict[str, Any]) -> str:
    """The LocalQueue the RayJob is queued in ("" = not managed by Kueue)."""
    return str(((rayjob.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or "")


def workload_resource(kube: Kube) -> Resource:
    """Where Workloads live on this cluster; ``K8sError`` (one line) when Kueue is not installed."""
    for version in WORKLOAD_VERSIONS:
        try:
            return kube.resource(version, "Workload")
        except K8sError as exc:
            if exc.transient:
                raise
    raise K8sError(f"the RayJob carries the label {QUEUE_LABEL} but this cluster does not serve Kueue's Workloads "
                   "(kueue.x-k8s.io); install Kueue or remove the label from the release's `labels`; nothing written")


def _owned_by(workload: dict[str, Any], rayjob: dict[str, Any]) -> bool:
    meta = rayjob.get("metadata") or {}
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        if not isinstance(ref, dict) or ref.get("kind") != "RayJob":
            continue
        if meta.get("uid") and ref.get("uid"):
            if ref["uid"] == meta["uid"]:
                return True
        elif ref.get("name") == meta.get("name"):
            return True
    return False


def workloads_of(kube: Kube, rayjob: dict[str, Any]) -> tuple[Resource, list[dict[str, Any]]]:
    """The Workloads the RayJob owns, oldest first."""
    res = workload_resource(kube)
    owned = [w for w in kube.list(res) if _owned_by(w, rayjob)]
    owned.sort(key=lambda w: (w["metadata"].get("creationTimestamp") or "", w["metadata"]["name"]))
    return res, owned


def set_active(kube: Kube, rayjob: dict[str, Any], active: bool) -> list[str]:
    """``spec.active`` of every Workload the RayJob owns; their names. One-line ``K8sError`` (transient: Kueue
    creates the Workload right after the job) when there is none yet."""
    res, owned = workloads_of(kube, rayjob)
    name = rayjob["metadata"]["name"]
    if not owned:
        raise K8sError(f"rayjob/{name} is queued in {queue_of(rayjob)!r} but no Kueue Workload owned by it exists "
                       "(yet): nothing written; retry in a few seconds, or check that Kueue manages RayJobs "
                       "(its integrations list ray.io/rayjob)", transient=True)
    for wl in owned:
        kube.merge_patch(res, wl["metadata"]["name"], {"spec": {"active": active}})
    return [wl["metadata"]["name"] for wl in owned]


def admission_line(workload: dict[str, Any]) -> str:
    """One line about a Workload for ``sc-app k8s status``."""
    spec, st = workload.get("spec") or {}, workload.get("status") or {}
    conds = {c.get("type"): c for c in st.get("conditions") or [] if isinstance(c, dict)}
    admitted = (conds.get("Admitted") or {}).get("status") == "True" or bool(st.get("admission"))
    state = "inactive (deactivated: stays suspended until resumed)" if spec.get("active") is False else (
        "admitted" if admitted else "active, waiting for quota")
    evicted = conds.get("Evicted") or {}
    why = f"; evicted: {evicted.get('reason')}" if evicted.get("status") == "True" and evicted.get("reason") else ""
    return f"kueue: workload/{workload['metadata']['name']} in queue {spec.get('queueName') or '?'}: {state}{why}"
