"""Create and remove the objects of one release: what ``sc-app k8s submit`` and ``sc-app k8s delete`` do.

Invariants:
- submit writes nothing until every kind it renders is served and every object that already exists is known to be
  this release's own (never a Helm release's, never another release's);
- a resubmit never runs on an older config: a companion left by an earlier submit of the same release (ConfigMap,
  Secret, ...) is replaced whole; only the checkpoint PVC is kept as it is (its bundles are what a resume needs);
- the RayJob carries the list of the companions submit wrote (annotation ``INVENTORY``), so delete removes exactly
  those, whatever kinds the chart renders; ``KEPT_KINDS`` (the checkpoint PVC) are never listed and never deleted;
- delete removes the RayJob first and its companions only once the RayJob is gone: while the Ray job still runs,
  KubeRay's finalizer reads the auth Secret to stop it and keeps the RayJob (and its cluster) until it can.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sc_app.io import strict_json
from sc_app.k8s import storage
from sc_app.k8s.api import K8sError, Kube, Resource, ref, seconds
from sc_app.k8s.release import Release

log = logging.getLogger(__name__)

INVENTORY = "sc-app/objects"  # RayJob annotation: JSON list of "apiVersion/kind/name", creation order
KEPT_KINDS = frozenset({"PersistentVolumeClaim"})
HELM_RELEASE = "meta.helm.sh/release-name"  # what Helm puts on every object it installs
INSTANCE = "app.kubernetes.io/instance"  # the chart's release label


def _item(obj: dict[str, Any]) -> str:
    return f"{obj['apiVersion']}/{obj['kind']}/{obj['metadata']['name']}"


def _parse_item(item: str) -> tuple[str, str, str]:
    api_version, kind, name = item.rsplit("/", 2)
    return api_version, kind, name


def _owner_problem(live: dict[str, Any], release: str) -> str | None:
    """Why ``live`` is not this release's to change, or None."""
    meta = live.get("metadata") or {}
    helm = (meta.get("annotations") or {}).get(HELM_RELEASE)
    if helm:
        return f"it belongs to Helm release {helm!r}: manage it with helm upgrade/uninstall, not sc-app k8s"
    instance = (meta.get("labels") or {}).get(INSTANCE)
    if instance != release:
        who = f"release {instance!r}" if instance else "no release (label app.kubernetes.io/instance unset)"
        return f"it belongs to {who}; choose another release name or remove it yourself"
    return None


def submit(kube: Kube, release: Release) -> list[str]:
    """Create (or replace, see the module invariants) the release's companions, then its RayJob; lines to print."""
    job = release.ray_object
    if job["kind"] != "RayJob":
        raise K8sError("submit needs mode: RayJob values (for a RayCluster use helm install)")
    name = job["metadata"]["name"]
    job_res = kube.resource_of(job)
    companions = [(kube.resource_of(o), o) for o in release.objects if o is not job]  # every kind served, first
    existing = kube.get(job_res, name)
    if existing is not None:
        if (existing.get("metadata") or {}).get("deletionTimestamp"):
            raise K8sError(
                f"rayjob/{name} is still being deleted (KubeRay stops its Ray job first); wait until it is gone "
                "(`sc-app k8s delete` waits for it), then submit again"
            )
        raise K8sError(
            f"rayjob/{name} already exists in namespace {kube.namespace}; `sc-app k8s delete {release.name}` it "
            "first (the checkpoint PVC is kept) or choose another release name"
        )
    live: dict[str, dict[str, Any] | None] = {}
    notes = _check_claims(kube, [o for _, o in companions if o["kind"] == "PersistentVolumeClaim"])
    notes += _check_per_pod_claims(kube, job)
    made = {o["metadata"]["name"] for _, o in companions if o["kind"] == "Secret"}
    _check_secrets(kube, job, made)
    for res, obj in companions:
        current = kube.get(res, obj["metadata"]["name"])
        if current is not None and obj["kind"] not in KEPT_KINDS:
            problem = _owner_problem(current, release.name)
            if problem:
                raise K8sError(f"{ref(obj)} exists in namespace {kube.namespace} and {problem}")
        live[_item(obj)] = current
    done: list[str] = list(notes)
    for res, obj in companions:
        current = live[_item(obj)]
        if current is None:
            kube.create(res, obj)
            done.append(f"created {ref(obj)}")
        elif obj["kind"] in KEPT_KINDS:
            done.append(f"kept existing {ref(obj)} (as it is: its bundles are what a resume needs)")
        else:
            fresh = json.loads(json.dumps(obj))
            fresh["metadata"]["resourceVersion"] = current["metadata"].get("resourceVersion", "")
            kube.replace(res, fresh)
            done.append(f"replaced {ref(obj)} (left by an earlier submit; now as rendered)")
    job = json.loads(json.dumps(job))
    inventory = [_item(o) for _, o in companions if o["kind"] not in KEPT_KINDS]
    job["metadata"].setdefault("annotations", {})[INVENTORY] = json.dumps(inventory)
    kube.create(job_res, job)
    done.append(f"created rayjob/{name}")
    return done


_UNREAD = object()  # a StorageClass that could not be read (not: one that does not exist, which is None)


def _storage_class(kube: Kube, name: str, notes: list[str], pending: str) -> Any:
    """StorageClass ``name`` (None: no such class); ``_UNREAD``, with a note in ``notes``, when it cannot be read for a
    reason a retry would not change (cluster-scoped RBAC is often not granted); a transient error is raised."""
    try:
        return kube.get(kube.resource("storage.k8s.io/v1", "StorageClass"), name)
    except K8sError as exc:
        if exc.transient:
            raise
        notes.append(f"note: StorageClass {name} not checked ({exc}); `sc-app k8s status` shows {pending}")
        return _UNREAD


def _check_claims(kube: Kube, claims: list[dict[str, Any]]) -> list[str]:
    """Refuse (before anything is written) a claim its StorageClass cannot bind; lines to print when the classes
    cannot be read (cluster-scoped RBAC is often not granted: the check is then skipped, and ``status`` shows a
    Pending claim)."""
    notes: list[str] = []
    for claim in claims:
        name = str((claim.get("spec") or {}).get("storageClassName") or "")
        if not name or kube.get(kube.resource("v1", "PersistentVolumeClaim"), claim["metadata"]["name"]):
            continue  # the cluster default (ReadWriteOnce only, see the chart) or a kept claim
        found = _storage_class(kube, name, notes, "a Pending claim")
        if found is _UNREAD:
            continue
        problem = storage.class_problem(claim, found)
        if problem:
            raise K8sError(problem)
    return notes


def _check_per_pod_claims(kube: Kube, job: dict[str, Any]) -> list[str]:
    """Refuse a per-pod claim template (checkpoint.volume=local, medium=ephemeral) whose StorageClass does not exist:
    every pod would stay Pending. Same notes as ``_check_claims`` when classes cannot be read."""
    notes: list[str] = []
    for name in sorted({str((t.get("spec") or {}).get("storageClassName") or "")
                        for t in storage.per_pod_claims(job)} - {""}):
        found = _storage_class(kube, name, notes, "Pending pods")
        if found is _UNREAD:
            continue
        problem = storage.class_problem({"spec": {"storageClassName": name, "accessModes": ["ReadWriteOnce"]}},
                                        found, what="each pod's checkpoint claim",
                                        field="checkpoint.local.storageClassName")
        if problem:
            raise K8sError(problem)
    return notes


def _secret_needs(job: dict[str, Any]) -> dict[str, set[str]]:
    """Secret name -> the keys the job's pods mount from it (every Secret volume, ``items`` or all), and the Ray
    token Secret KubeRay reads (``authOptions``): what a pod or KubeRay waits for when it is missing."""
    needs: dict[str, set[str]] = {}
    cluster = job["spec"].get("rayClusterSpec") or {}
    groups = [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]
    for group in groups:
        for vol in ((group.get("template") or {}).get("spec") or {}).get("volumes") or []:
            sec = vol.get("secret")
            if sec and sec.get("secretName") and not sec.get("optional"):
                needs.setdefault(sec["secretName"], set()).update(i["key"] for i in sec.get("items") or [])
    auth = (cluster.get("authOptions") or {}).get("secretName")
    if auth:
        needs.setdefault(auth, set()).add("auth_token")
    return needs


def _check_secrets(kube: Kube, job: dict[str, Any], made: set[str]) -> None:
    """Refuse (before anything is written) a Secret the job needs that is missing or lacks a key it mounts (the HMAC
    keyring of checkpoint.hmac.existingSecret, rayAuth.existingSecret, extraVolumes): its pods would wait in
    ContainerCreating until preRunningDeadlineSeconds, retry after retry. Reading them needs no more RBAC than
    submit has anyway (it reads the Secrets it creates)."""
    for name, keys in sorted(_secret_needs(job).items()):
        if name in made:
            continue
        found = kube.get(kube.resource("v1", "Secret"), name)
        if found is None:
            raise K8sError(
                f"secret/{name} does not exist in namespace {kube.namespace} and the job's pods mount it "
                f"(checkpoint.hmac.existingSecret, rayAuth.existingSecret or extraVolumes): create it first; "
                "nothing written"
            )
        missing = sorted(keys - set(found.get("data") or {}) - set(found.get("stringData") or {}))
        if missing:
            raise K8sError(
                f"secret/{name} has no key {', '.join(missing)} (it has: {', '.join(sorted(found.get('data') or {}))});"
                " add it or fix checkpoint.hmac.keys / secretKey; nothing written"
            )


@dataclass
class Deletion:
    """What ``delete`` did; ``complete`` is False when the RayJob outlived the timeout (companions then kept)."""

    lines: list[str] = field(default_factory=list)
    complete: bool = True


def _claims(job: dict[str, Any] | None, release: Release) -> list[str]:
    names = [o["metadata"]["name"] for o in release.objects if o["kind"] in KEPT_KINDS]
    if job is not None:
        spec = job.get("spec") or {}
        pod = ((spec.get("rayClusterSpec") or {}).get("headGroupSpec") or {}).get("template", {}).get("spec", {})
        names += [
            v["persistentVolumeClaim"]["claimName"]
            for v in pod.get("volumes") or []
            if isinstance(v, dict) and isinstance(v.get("persistentVolumeClaim"), dict)
        ]
    return sorted(set(names))


def delete(kube: Kube, release: Release, *, timeout: float, poll: float = 2.0) -> Deletion:
    """Delete the RayJob, wait (at most ``timeout`` s) until it is gone, then the companions submit wrote."""
    out = Deletion()
    job_res = kube.resource("ray.io/v1", "RayJob")
    name = release.ray_object["metadata"]["name"]
    job = kube.get(job_res, name)
    if job is None:
        items = [_item(o) for o in release.objects if o is not release.ray_object and o["kind"] not in KEPT_KINDS]
        out.lines.append(f"rayjob/{name}: already gone; removing what the chart renders for this release")
    else:
        problem = _owner_problem(job, release.name)
        if problem:
            raise K8sError(f"rayjob/{name} is not sc-app k8s's to delete: {problem}")
        recorded = ((job.get("metadata") or {}).get("annotations") or {}).get(INVENTORY)
        try:
            items = [str(i) for i in strict_json.parse(recorded)] if recorded else []
        except (ValueError, TypeError):
            raise K8sError(f"rayjob/{name}: annotation {INVENTORY} is not JSON; remove the rest by hand") from None
        if not recorded:
            items = [_item(o) for o in release.objects if o is not release.ray_object and o["kind"] not in KEPT_KINDS]
        if not (job.get("metadata") or {}).get("deletionTimestamp"):
            kube.delete(job_res, name)
        out.lines.append(f"deleting rayjob/{name} (KubeRay stops the Ray job, then removes its cluster)")
        if not _wait_gone(kube, job_res, name, timeout, poll):
            out.complete = False
            out.lines.append(
                f"rayjob/{name} is still being deleted after {seconds(timeout)}s (KubeRay's finalizer stops the Ray "
                "job first; it needs the operator running); its companions are kept until it is gone: run "
                f"`sc-app k8s delete {release.name}` again later"
            )
            return out
        out.lines.append(f"deleted rayjob/{name}")
    for item in reversed(items):
        out.lines.extend(_delete_item(kube, item, release.name))
    claims = _claims(job, release)
    if not claims and storage.checkpoint_is_local(job or release.ray_object):
        out.lines.append("no checkpoint PVC (checkpoint.volume=local): the bundles the job kept are on its bucket")
        return out
    what = ", ".join(f"persistentvolumeclaim/{c}" for c in claims) or "the checkpoint PVC"
    out.lines.append(f"kept {what}: the checkpoint PVC and its bundles are kept")
    return out


def _wait_gone(kube: Kube, res: Resource, name: str, timeout: float, poll: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        saved, kube.deadline = kube.deadline, deadline
        try:
            if kube.get(res, name) is None:
                return True
        except K8sError as exc:
            if not exc.transient:
                raise
            log.info("%s/%s: %s", res.kind.lower(), name, exc)
        finally:
            kube.deadline = saved
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(poll, left))


def _delete_item(kube: Kube, item: str, release: str) -> list[str]:
    api_version, kind, name = _parse_item(item)
    if kind in KEPT_KINDS:
        return []
    what = f"{kind.lower()}/{name}"
    try:
        res = kube.resource(api_version, kind)
    except K8sError as exc:
        if exc.status is None and "not served" in str(exc):
            return [f"skipped {what}: {api_version} is no longer served by this cluster"]
        raise
    live = kube.get(res, name)
    if live is None:
        return [f"{what}: already gone"]
    problem = _owner_problem(live, release)
    if problem:
        return [f"kept {what}: {problem}"]
    kube.delete(res, name)
    return [f"deleted {what}"]
