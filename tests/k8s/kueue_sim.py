"""A stand-in for Kueue's job reconciler on RayJobs, plugged into ``FakeApiServer.controllers``.

What it does after every request, per RayJob that carries ``kueue.x-k8s.io/queue-name`` (Kueue's jobframework
reconciler, as documented and reviewed in its source):
- creates the job's Workload (``rayjob-<name>-<uid tail>``, ``ownerReferences`` naming the RayJob, ``spec.active``
  true, ``spec.queueName``) when there is none;
- admits an active Workload when ``quota`` is true (``status.admission``, condition Admitted);
- a deactivated Workload (``spec.active: false``) is evicted (condition Evicted, reason Deactivated), loses its
  admission, and its job is suspended;
- **a suspended job whose Workload is admitted is unsuspended** ("Job admitted, unsuspending"): what undoes a plain
  ``spec.suspend: true``;
- a running job whose Workload is not admitted is suspended again.
``events`` records what it did, in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
WORKLOADS = {"kueue.x-k8s.io/v1beta1": {"workloads": ("Workload", True)}}


@dataclass
class KueueSim:
    quota: bool = True  # the ClusterQueue has room for the whole job
    events: list[str] = field(default_factory=list)

    def install(self, server: Any) -> KueueSim:
        server.extra_groups.update(WORKLOADS)
        server.controllers.append(self)
        return self

    def __call__(self, server: Any) -> None:
        for (plural, ns, name), job in list(server.store.items()):
            queue = (job["metadata"].get("labels") or {}).get(QUEUE_LABEL)
            if plural != "rayjobs" or not queue or job["metadata"].get("deletionTimestamp"):
                continue
            wl = self.workload(server, ns, job) or self._create(server, ns, job, queue)
            self._reconcile(wl, job, name)

    @staticmethod
    def workload(server: Any, ns: str, job: dict[str, Any]) -> dict[str, Any] | None:
        uid = job["metadata"].get("uid")
        for (plural, wns, _), wl in server.store.items():
            refs = wl["metadata"].get("ownerReferences") or []
            if plural == "workloads" and wns == ns and any(r.get("uid") == uid for r in refs):
                return wl
        return None

    def _create(self, server: Any, ns: str, job: dict[str, Any], queue: str) -> dict[str, Any]:
        meta = job["metadata"]
        name = f"rayjob-{meta['name']}-{meta['uid'][-5:]}"
        self.events.append(f"created workload/{name}")
        return server.add("workloads", {
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True}]},
            "spec": {"active": True, "queueName": queue, "podSets": []}, "status": {}}, ns)

    def _reconcile(self, wl: dict[str, Any], job: dict[str, Any], name: str) -> None:
        spec, st = job.setdefault("spec", {}), wl.setdefault("status", {})
        active = wl["spec"].get("active", True) is not False
        if not active and st.get("admission"):
            st.pop("admission")
            st["conditions"] = [{"type": "Evicted", "status": "True", "reason": "Deactivated"}]
            self.events.append(f"evicted {wl['metadata']['name']} (Deactivated)")
        elif active and not st.get("admission") and self.quota:
            st["admission"] = {"clusterQueue": "cq"}
            st["conditions"] = [{"type": "Admitted", "status": "True", "reason": "Admitted"}]
            self.events.append(f"admitted {wl['metadata']['name']}")
        admitted = bool(st.get("admission"))
        if admitted and spec.get("suspend"):
            spec["suspend"] = False
            self.events.append(f"rayjob/{name}: Job admitted, unsuspending")
        elif not admitted and not spec.get("suspend"):
            spec["suspend"] = True
            self.events.append(f"rayjob/{name}: not admitted, suspending")
