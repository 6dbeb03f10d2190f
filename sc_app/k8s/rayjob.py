"""One RayJob: its status (KubeRay's view, the head's preflight decision, the running driver's progress), ``wait``,
``suspend``/``resume``.

Invariants: ``status`` only reads; a part of the status that cannot be read (preflight log, live driver progress) is
one line in the output and never hides the rest; ``wait`` never runs past its deadline and rides out transient API
errors (no answer, 5xx) until then.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from sc_app import strict_json
from sc_app.k8s.api import DeadlinePassed, K8sError, Kube, Resource, seconds
from sc_app.k8s.live import LiveStatus, LiveUnavailable, live_status

log = logging.getLogger(__name__)

# JobDeploymentStatus values after which KubeRay does nothing more for the job.
TERMINAL = {"Complete", "Failed", "ValidationFailed"}


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
    head_pod: str | None = None
    resume_step: int | None = None
    resume_decision: str | None = None
    live: LiveStatus | None = None
    live_error: str | None = None

    @classmethod
    def of(cls, obj: dict[str, Any]) -> JobStatus:
        st = obj.get("status") or {}
        spec = obj.get("spec") or {}
        return cls(
            name=obj["metadata"]["name"],
            deployment_status=st.get("jobDeploymentStatus", ""),
            job_status=st.get("jobStatus", ""),
            failed=int(st.get("failed") or 0),
            succeeded=int(st.get("succeeded") or 0),
            backoff_limit=int(spec.get("backoffLimit") or 0),
            suspended=bool(spec.get("suspend")),
            cluster=st.get("rayClusterName", ""),
            message=st.get("message", ""),
        )

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
            "headPod": self.head_pod,
            "resumeStep": self.resume_step,
            "resumeDecision": self.resume_decision,
            "live": self.live.as_dict() if self.live else None,
            "liveError": self.live_error,
        }

    def lines(self) -> list[str]:
        step = (
            "unknown (no preflight log yet)"
            if self.resume_decision is None
            else (f"step {self.resume_step}" if self.resume_step is not None else "none (fresh start)")
        )
        out = [
            f"rayjob/{self.name}: {self.deployment_status or 'New'}"
            + (" (suspended)" if self.suspended else "")
            + (f", job {self.job_status}" if self.job_status else ""),
            f"retries used: {self.retries_used} of backoffLimit {self.backoff_limit}",
            f"newest bundle at the last (re)start: {step}"
            + (f" [{self.resume_decision}]" if self.resume_decision else ""),
        ]
        out += [f"message: {self.message}"] if self.message else []
        if self.live is not None:
            out += self.live.lines()
        elif self.live_error:
            out.append(f"live: {self.live_error}")
        return out


class RayJobs:
    """RayJob verbs in ``kube``'s namespace."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._res: Resource | None = None

    @property
    def res(self) -> Resource:
        if self._res is None:
            self._res = self.kube.resource("ray.io/v1", "RayJob")
        return self._res

    def get(self, name: str) -> dict[str, Any]:
        return self.kube.must_get(self.res, name)

    def set_suspend(self, name: str, suspend: bool) -> None:
        self.kube.merge_patch(self.res, name, {"spec": {"suspend": suspend}})

    def head_pod(self, cluster: str) -> dict[str, Any] | None:
        """The newest head pod of ``cluster`` that is not being deleted (an old one may linger after a loss)."""
        pods = self.kube.list(
            self.kube.resource("v1", "Pod"), selector=f"ray.io/cluster={cluster},ray.io/node-type=head"
        )
        alive = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        alive.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        return alive[-1] if alive else None

    def resume_point(self, pod: str) -> tuple[int | None, str | None]:
        """(step, decision) from the head's preflight initContainer log (JSON); (None, None) when unavailable."""
        try:
            text = self.kube.pod_log(pod, "preflight")
        except K8sError as exc:  # status must still answer when logs are not readable
            log.debug("preflight log unavailable: %s", exc)
            return None, None
        start = text.find("{")
        try:
            doc = strict_json.parse(text[start:]) if start >= 0 else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            return None, None
        decision = str(doc.get("decision"))
        step = doc.get("step") if decision == "resume" else None  # a fresh start reports step 0: no bundle
        return (int(step) if step is not None else None), decision

    def _add_head(self, st: JobStatus) -> None:
        if not st.cluster:
            return
        try:
            pod = self.head_pod(st.cluster)
        except K8sError as exc:
            log.debug("head pod unavailable: %s", exc)
            return
        if pod is not None:
            st.head_pod = pod["metadata"]["name"]
            st.resume_step, st.resume_decision = self.resume_point(st.head_pod)

    def status(self, name: str, *, live: bool = True, last_events: int = 5) -> JobStatus:
        obj = self.get(name)
        st = JobStatus.of(obj)
        self._add_head(st)
        if live:
            try:
                st.live = live_status(self.kube, obj, last_events=last_events)
            except LiveUnavailable as exc:
                st.live_error = str(exc)
        return st

    def wait(self, name: str, timeout: float, poll: float = 5.0, *, started: float | None = None) -> JobStatus:
        """Poll until the job reaches a terminal deployment status; ``TimeoutError`` once ``timeout`` s have passed
        since ``started`` (``time.monotonic()``, default now); every request is bounded by what is left. Transient
        API errors are logged and retried until then."""
        self.kube.deadline = (time.monotonic() if started is None else started) + timeout
        last_seen: JobStatus | None = None
        last_error = ""
        while True:
            try:
                st = JobStatus.of(self.get(name))
            except DeadlinePassed:
                pass
            except K8sError as exc:
                if not exc.transient:
                    raise
                if str(exc) != last_error and (self.kube.time_left() or 0.0) > 0:
                    log.warning("%s (retrying until the --timeout)", exc)
                last_error = str(exc)
            else:
                last_error = ""
                if last_seen is None or (st.deployment_status, st.job_status, st.failed) != (
                    last_seen.deployment_status,
                    last_seen.job_status,
                    last_seen.failed,
                ):
                    log.info(
                        "rayjob/%s: %s, job %s, retries %d/%d",
                        name,
                        st.deployment_status or "New",
                        st.job_status or "-",
                        st.failed,
                        st.backoff_limit,
                    )
                last_seen = st
                if st.finished:
                    self._final(st)
                    return st
            left = self.kube.time_left() or 0.0
            if left <= 0:
                if last_error or last_seen is None:
                    reason = last_error or f"rayjob/{name}: no answer"
                    raise TimeoutError(f"gave up after the {seconds(timeout)}s --timeout: {reason}")
                raise TimeoutError(
                    f"rayjob/{name} still {last_seen.deployment_status or 'New'} after {seconds(timeout)}s"
                )
            time.sleep(min(poll, left))

    def _final(self, st: JobStatus) -> None:
        """Add the head's preflight decision when time is left; a finished job is reported either way."""
        self._add_head(st)
