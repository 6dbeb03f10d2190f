"""The checkpoint claim on a live cluster: can its StorageClass give what the pods need, and why is it Pending.

Facts this relies on:
- a claim's class is ``spec.storageClassName`` (the default class is filled in at admission when it is unset); the
  provisioner that serves it is the class's ``provisioner`` and, once the controller picked it up, the claim's
  annotation ``volume.kubernetes.io/storage-provisioner``;
- the CSI drivers below provision block disks, which a node attaches exclusively: ReadWriteOnce (and
  ReadWriteOncePod) only. A claim asking them for ReadWriteMany is never bound; the driver says so in a
  ``ProvisioningFailed`` event on the claim (e.g. "Volume capabilities MULTI_NODE_MULTI_WRITER not supported"), and
  every pod that mounts it stays Pending (KubeRay fails the attempt only at ``preRunningDeadlineSeconds``);
- the managed clouds' RWX classes are file systems: EFS (``efs.csi.aws.com``), Filestore
  (``filestore.csi.storage.gke.io``, classes ``standard-rwx``...), Azure Files (``file.csi.azure.com``,
  ``azurefile-csi``).

Invariant: an unknown provisioner is never refused (on-prem NFS, CephFS, Longhorn RWX...); only a known block driver
asked for ReadWriteMany is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RWO_ONLY_PROVISIONERS = frozenset({
    "ebs.csi.aws.com",
    "kubernetes.io/aws-ebs",
    "pd.csi.storage.gke.io",
    "kubernetes.io/gce-pd",
    "disk.csi.azure.com",
    "kubernetes.io/azure-disk",
    "dobs.csi.digitalocean.com",
    "cinder.csi.openstack.org",
    "rancher.io/local-path",
    "topolvm.io",
})
RWX_HINT = (
    "EKS: an EFS class of efs.csi.aws.com, e.g. efs-sc; GKE: Filestore standard-rwx; AKS: Azure Files azurefile-csi"
)
PROVISIONER_ANNOTATION = "volume.kubernetes.io/storage-provisioner"
STORAGE_DOC = "docs/kubernetes-storage.md"


def class_problem(claim: dict[str, Any], storage_class: dict[str, Any] | None, *,
                  what: str = "", field: str = "checkpoint.persistence.storageClassName") -> str | None:
    """Why ``claim`` (about to be created) cannot be bound with ``storage_class`` (None: it does not exist), or None.
    ``what`` names it in the line (default ``persistentvolumeclaim/<name>``), ``field`` is the value that sets it."""
    spec = claim.get("spec") or {}
    modes = list(spec.get("accessModes") or [])
    name = str(spec.get("storageClassName") or "")
    what = what or f"persistentvolumeclaim/{claim['metadata']['name']}"
    if not name:
        return None  # the cluster default: the chart only allows it with ReadWriteOnce
    if storage_class is None:
        return f"{what}: StorageClass {name} does not exist on this cluster; fix {field}"
    provisioner = str(storage_class.get("provisioner") or "")
    if "ReadWriteMany" in modes and provisioner in RWO_ONLY_PROVISIONERS:
        return (
            f"{what}: StorageClass {name} ({provisioner}) gives ReadWriteOnce block volumes but the claim needs "
            f"ReadWriteMany: it would stay Pending and every attempt with it; use an RWX class ({RWX_HINT}), a "
            "bucket instead (checkpoint.volume=local, helm/sc-app/ci/no-rwx-values.yaml) or one "
            f"pod (helm/sc-app/ci/single-pod-rwo-values.yaml); {STORAGE_DOC}"
        )
    return None


@dataclass(frozen=True)
class ClaimState:
    """A claim as ``status``/``wait`` show it."""

    name: str
    phase: str
    storage_class: str
    provisioner: str
    modes: tuple[str, ...]
    event: str = ""  # "Reason: message" of the claim's newest event, "" when none

    @property
    def pending(self) -> bool:
        return self.phase in ("Pending", "Missing")

    def line(self) -> str:
        if self.phase == "Missing":
            return (f"claim persistentvolumeclaim/{self.name}: does not exist, so every pod that mounts it stays "
                    "Pending; create it (or fix checkpoint.persistence.existingClaim / model.existingClaim)")
        where = ", ".join(p for p in (f"class {self.storage_class or '(none)'}",
                                      f"provisioner {self.provisioner}" if self.provisioner else "",
                                      "[" + ", ".join(self.modes) + "]") if p)
        out = f"claim persistentvolumeclaim/{self.name}: {self.phase or 'Pending'} ({where})"
        if self.event:
            out += f": {self.event}"
        if "ReadWriteMany" in self.modes and self.provisioner in RWO_ONLY_PROVISIONERS:
            out += f"; {self.provisioner} gives ReadWriteOnce only: use an RWX class ({RWX_HINT}), {STORAGE_DOC}"
        return out


def claim_state(claim: dict[str, Any], events: list[dict[str, Any]]) -> ClaimState:
    """What ``claim`` is waiting for: its phase, class, provisioner and newest event (by last/event time)."""
    spec, meta = claim.get("spec") or {}, claim.get("metadata") or {}
    newest = max(events, key=_event_time, default=None)
    event = ""
    if newest is not None:
        message = " ".join(str(newest.get("message") or newest.get("note") or "").split())[:300]
        event = f"{newest.get('reason') or 'Event'}: {message}".rstrip(": ")
    return ClaimState(
        name=str(meta.get("name", "")),
        phase=str((claim.get("status") or {}).get("phase") or "Pending"),
        storage_class=str(spec.get("storageClassName") or ""),
        provisioner=str((meta.get("annotations") or {}).get(PROVISIONER_ANNOTATION) or ""),
        modes=tuple(spec.get("accessModes") or ()),
        event=event,
    )


def _event_time(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               (event.get("metadata") or {}).get("creationTimestamp") or "")


def per_pod_claims(rayjob: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim templates of the job's generic ephemeral volumes (``checkpoint.volume=local`` with
    ``medium=ephemeral``: each pod creates its own ReadWriteOnce claim from one), head's first, one per group."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    out: list[dict[str, Any]] = []
    for group in [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or [])]:
        for vol in ((group.get("template") or {}).get("spec") or {}).get("volumes") or []:
            template = (vol.get("ephemeral") or {}).get("volumeClaimTemplate") if isinstance(vol, dict) else None
            if isinstance(template, dict):
                out.append(template)
    return out


def checkpoint_is_local(rayjob: dict[str, Any]) -> bool:
    """Whether the head's checkpoint directory (the chart's volume ``checkpoints``) is the pod's own (emptyDir or a
    per-pod claim: ``checkpoint.volume=local``) rather than a shared claim."""
    head = ((rayjob.get("spec") or {}).get("rayClusterSpec") or {}).get("headGroupSpec") or {}
    for vol in ((head.get("template") or {}).get("spec") or {}).get("volumes") or []:
        if isinstance(vol, dict) and vol.get("name") == "checkpoints":
            return "persistentVolumeClaim" not in vol
    return False


def mounted_claims(rayjob: dict[str, Any]) -> list[str]:
    """Names of the claims the RayJob's head and worker pods mount (checkpoint and model), in order, once each."""
    cluster = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    templates = [(cluster.get("headGroupSpec") or {}).get("template") or {}]
    templates += [g.get("template") or {} for g in cluster.get("workerGroupSpecs") or [] if isinstance(g, dict)]
    names: list[str] = []
    for tmpl in templates:
        for vol in (tmpl.get("spec") or {}).get("volumes") or []:
            pvc = vol.get("persistentVolumeClaim") if isinstance(vol, dict) else None
            if isinstance(pvc, dict) and pvc.get("claimName") and pvc["claimName"] not in names:
                names.append(str(pvc["claimName"]))
    return names
