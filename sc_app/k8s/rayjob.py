"""One RayJob: its status (KubeRay's view, the head's preflight decision, the running driver's progress), ``wait``,
``suspend``/``resume``.

Invariants: ``status`` only reads; a part of the status that cannot be read (preflight log, live driver progress) is
one line in the output and never hides the rest; ``wait`` never runs past its deadline and rides out transient API
errors (no answer, 5xx) until then.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sc_app.k8s import kueue, preflight_state
from sc_app.k8s.api import DeadlinePassed, K8sError, Kube, Resource, seconds
from sc_app.k8s.live import LiveStatus, LiveUnavailable, live_status
from sc_app.k8s.storage import ClaimState, claim_state, mounted_claims

log = logging.getLogger(__name__)

# JobDeploymentStatus values after which KubeRay does nothing more for the job.
TERMINAL = {"Complete", "Failed", "ValidationFailed"}
# KubeRay >= 1.7 (rayjob_controller.go checkJobStatusCheckTimeoutAndUpdateStatusIfNeeded): status checks of the
# dashboard failing for RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (operator env, default 300) fail the job with this
# status.reason, and such a failure is never retried, whatever backoffLimit says.
STATUS_CHECK_TIMEOUT = "JobStatusCheckTimeoutExceeded"
STATUS_CHECK_HINT = (
    "raise RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS on the KubeRay operator and keep the head on on-demand nodes "
    "(head.nodeSelector/affinity/tolerations); ops/RUNBOOKS.md \"Head replaced\""
)


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
    reason: str = ""
    status_checks_failing_since: str = ""
    head_pod: str | None = None
    resume_step: int | None = None
    resume_decision: str | None = None
    live: LiveStatus | None = None
    live_error: str | None = None
    claims: list[ClaimState] = field(default_factory=list)
    pods_left: list[str] | None = None  # pods of a suspended/suspending job, found by its labels (None: not asked)
    kueue: list[str] = field(default_factory=list)  # one line per Kueue Workload of a queued job
    pre_running_deadline: int | None = None  # spec.preRunningDeadlineSeconds
    preflight: preflight_state.PreflightState | None = None
    remote: Any = None  # remote_state.RemoteState: the bucket's newest bundle, when checkpoint.remote is set

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
            reason=str(st.get("reason") or ""),
            status_checks_failing_since=str(st.get("jobStatusCheckFailureStartTime") or ""),
            pre_running_deadline=spec.get("preRunningDeadlineSeconds"),
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
            "reason": self.reason,
            "statusChecksFailingSince": self.status_checks_failing_since or None,
            "claims": [{"name": c.name, "phase": c.phase, "line": c.line()} for c in self.claims],
            "headPod": self.head_pod,
            "resumeStep": self.resume_step,
            "resumeDecision": self.resume_decision,
            "live": self.live.as_dict() if self.live else None,
            "liveError": self.live_error,
            "podsLeft": self.pods_left,
            "kueue": self.kueue,
            "preflightRefusal": self.preflight.reason if self.preflight and self.preflight.refusing else None,
            "remote": self.remote.as_dict() if self.remote is not None else None,
        }

    def lines(self) -> list[str]:
        step = (
            "unknown (no preflight log yet)"
            if self.resume_decision is None
            else "none: preflight refuses to resume (below)"
            if self.resume_decision == "refuse"
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
        out += [self.remote.line()] if self.remote is not None else []
        out += [f"message: {self.message}"] if self.message else []
        out += self.kuberay_lines()
        out += self.kueue
        if self.pods_left is not None:
            out.append(f"pods of the job still there: {len(self.pods_left)} ({', '.join(self.pods_left[:3])}); a "
                       "terminating one still runs its preStop hook and may publish a bundle" if self.pods_left
                       else "pods of the job: none left (no writer on the PVC)")
        out += [c.line() for c in self.claims if c.pending]
        if self.live is not None:
            out += self.live.lines()
        elif self.live_error:
            out.append(f"live: {self.live_error}")
        return out


    def kuberay_lines(self) -> list[str]:
        """KubeRay's own reasons that the retry count does not show."""
        if self.reason == STATUS_CHECK_TIMEOUT:
            return [f"reason: {STATUS_CHECK_TIMEOUT}: KubeRay could not read the job's status from the head and failed "
                    f"it for good (not retried, whatever backoffLimit says); {STATUS_CHECK_HINT}"]
        if self.status_checks_failing_since and not self.finished:
            since = self.status_checks_failing_since
            return [f"warning: KubeRay's status checks of the head fail since {since}; after "
                    f"RAYJOB_STATUS_CHECK_TIMEOUT_SECONDS (default 300) it fails the job with {STATUS_CHECK_TIMEOUT}, "
                    "not retried"]
        out = []
        if self.reason == preflight_state.PRE_RUNNING_DEADLINE:
            out.append(f"reason: {self.reason}: an attempt did not reach Running within preRunningDeadlineSeconds "
                       f"({self.pre_running_deadline or '?'} s; KubeRay retries it, up to backoffLimit): a refusing "
                       "preflight, a pod that cannot be scheduled or an image that cannot be pulled")
        elif self.reason:
            out.append(f"reason: {self.reason}")
        refusal = self.preflight.refusal_line(self.pre_running_deadline) if self.preflight else None
        return out + ([refusal] if refusal else [])


def job_pod_selector(rayjob: dict[str, Any]) -> str:
    """A label selector for every Ray pod of the job whatever its cluster: the labels all its pod templates share
    (the chart's release labels); "" when they share none (then only ``ray.io/cluster`` finds its pods)."""
    spec = (rayjob.get("spec") or {}).get("rayClusterSpec") or {}
    groups = [spec.get("headGroupSpec") or {}, *(spec.get("workerGroupSpecs") or [])]
    common: dict[str, str] | None = None
    for group in groups:
        labels = ((group.get("template") or {}).get("metadata") or {}).get("labels") or {}
        common = dict(labels) if common is None else {k: v for k, v in common.items() if labels.get(k) == v}
    return ",".join(f"{k}={v}" for k, v in sorted((common or {}).items()))


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

    def cluster_pods(self, clusters: set[str], selector: str = "") -> list[str]:
        """Names of the pods (terminating ones included) of ``clusters`` and of those ``selector`` matches (the
        job's own labels, which every pod of every cluster of the job carries: ``status.rayClusterName`` is cleared
        while a suspended cluster's pods still run)."""
        pods = self.kube.resource("v1", "Pod")
        selectors = [f"ray.io/cluster={c}" for c in sorted(clusters)] + ([selector] if selector else [])
        return sorted({p["metadata"]["name"] for s in selectors for p in self.kube.list(pods, selector=s)})

    def wait_suspended(self, name: str, clusters: set[str], timeout: float, poll: float,
                       selector: str = "") -> JobStatus:
        """Until KubeRay says Suspended and every pod of ``clusters`` (and of any cluster seen meanwhile) and every
        pod ``selector`` matches is gone: a pod that is still terminating runs its preStop hook and may still
        publish a bundle. ``TimeoutError`` after ``timeout`` s."""
        self.kube.deadline = time.monotonic() + timeout
        what = "no answer yet"
        while True:
            try:
                st = JobStatus.of(self.get(name))
                clusters |= {st.cluster} - {""}
                left = self.cluster_pods(clusters, selector) if st.deployment_status == "Suspended" else None
            except K8sError as exc:  # out of time (DeadlinePassed, a request cut at the deadline) or transient
                if not (exc.transient or isinstance(exc, DeadlinePassed)):
                    raise
                left = None
            else:
                if left == []:
                    return st
                what = f"{len(left)} pod(s) still terminating ({', '.join(left[:3])})" if left else (
                    f"deployment status {st.deployment_status or 'New'}")
            if (self.kube.time_left() or 0.0) <= 0:
                raise TimeoutError(f"rayjob/{name} not suspended after {seconds(timeout)}s: {what}")
            time.sleep(min(poll, max(self.kube.time_left() or 0.0, 0.0)))

    def wait_not_suspending(self, name: str, timeout: float, poll: float) -> None:
        """Until KubeRay has finished a suspension in progress (it does not act on a resume while Suspending)."""
        self.kube.deadline = time.monotonic() + timeout
        try:
            while JobStatus.of(self.get(name)).deployment_status == "Suspending":
                time.sleep(min(poll, max(self.kube.time_left() or 0.0, 0.0)))
        except DeadlinePassed:
            raise TimeoutError(f"rayjob/{name} still Suspending after {seconds(timeout)}s; resume it later") from None
        self.kube.deadline = None

    def head_pod(self, cluster: str) -> dict[str, Any] | None:
        """The newest head pod of ``cluster`` that is not being deleted (an old one may linger after a loss)."""
        pods = self.kube.list(
            self.kube.resource("v1", "Pod"), selector=f"ray.io/cluster={cluster},ray.io/node-type=head"
        )
        alive = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        alive.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        return alive[-1] if alive else None

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
            st.preflight = preflight_state.read(self.kube, pod)
            st.resume_step, st.resume_decision = st.preflight.step, st.preflight.decision

    def claims(self, rayjob: dict[str, Any]) -> list[ClaimState]:
        """The claims the job's pods mount, with what a Pending one waits for; unreadable ones are left out."""
        out: list[ClaimState] = []
        for name in mounted_claims(rayjob):
            try:
                pvc = self.kube.get(self.kube.resource("v1", "PersistentVolumeClaim"), name)
                if pvc is None:
                    out.append(ClaimState(name, "Missing", "", "", ()))
                    continue
            except K8sError as exc:  # status must still answer without PVC read access
                if isinstance(exc, DeadlinePassed):
                    raise
                log.debug("claim %s unavailable: %s", name, exc)
                continue
            out.append(claim_state(pvc, self._claim_events(pvc, name)))
        return out

    def _claim_events(self, pvc: dict[str, Any], name: str) -> list[dict[str, Any]]:
        """A Pending claim's events (what it waits for); [] when bound or when events cannot be read."""
        if str((pvc.get("status") or {}).get("phase") or "Pending") != "Pending":
            return []
        try:
            return self.kube.list(self.kube.resource("v1", "Event"),
                                  fields=f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name}")
        except DeadlinePassed:
            raise
        except K8sError as exc:
            log.debug("events of claim %s unavailable: %s", name, exc)
            return []

    def status(self, name: str, *, live: bool = True, last_events: int = 5) -> JobStatus:
        obj = self.get(name)
        st = JobStatus.of(obj)
        st.claims = self.claims(obj)
        self._add_head(st)
        self._add_suspension(obj, st)
        if live:
            try:
                st.live = live_status(self.kube, obj, last_events=last_events)
            except LiveUnavailable as exc:
                st.live_error = str(exc)
        return st

    def _add_suspension(self, obj: dict[str, Any], st: JobStatus) -> None:
        """The pods a suspended job still has (by its labels: rayClusterName is already cleared) and its Kueue
        Workload; a part that cannot be read is left out."""
        try:
            if st.suspended or st.deployment_status in ("Suspending", "Suspended"):
                st.pods_left = self.cluster_pods({st.cluster} - {""}, job_pod_selector(obj))
            if kueue.queue_of(obj):
                st.kueue = [kueue.admission_line(w) for w in kueue.workloads_of(self.kube, obj)[1]] or [
                    f"kueue: queue {kueue.queue_of(obj)}: no Workload owned by the job (yet)"]
        except DeadlinePassed:
            raise
        except K8sError as exc:
            log.debug("suspension details unavailable: %s", exc)
            st.kueue = st.kueue or ([f"kueue: {exc}"] if kueue.queue_of(obj) else [])

    def wait(self, name: str, timeout: float, poll: float = 5.0, *, started: float | None = None) -> JobStatus:
        """Poll until the job reaches a terminal deployment status; ``TimeoutError`` once ``timeout`` s have passed
        since ``started`` (``time.monotonic()``, default now); every request is bounded by what is left. Transient
        API errors are logged and retried until then."""
        self.kube.deadline = (time.monotonic() if started is None else started) + timeout
        last_seen: JobStatus | None = None
        last_error = ""
        reported: set[str] = set()
        while True:
            try:
                obj = self.get(name)
                st = JobStatus.of(obj)
                if not st.finished and st.deployment_status != "Running":
                    self._report_claims(obj, reported)
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

    def _report_claims(self, rayjob: dict[str, Any], reported: set[str]) -> None:
        """Log a Pending claim (and what it waits for) once per new state: a claim that cannot be bound holds every
        pod, and KubeRay fails the attempt only at preRunningDeadlineSeconds. A poll whose events read failed (the
        same claim without its event) is not a new state."""
        for claim in (c for c in self.claims(rayjob) if c.pending):
            line = claim.line()
            if line not in reported:
                reported.update((line, replace(claim, event="").line()))
                log.warning("%s", line)

    def _final(self, st: JobStatus) -> None:
        """Add the head's preflight decision when time is left; a finished job is reported either way."""
        self._add_head(st)
