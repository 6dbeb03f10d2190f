"""What the head's ``preflight`` init container decided and whether it is crash-looping on a refusal.

``sc-app preflight --json`` prints the plan (``decision`` resume | fresh | refuse, ``step``, ``reason``) and exits 2 on
a refusal; the kubelet then restarts the init container until KubeRay fails the attempt at
``preRunningDeadlineSeconds`` (reason ``PreRunningDeadlineExceeded``) and retries it, where the same refusal repeats.
Invariant: reading never raises for an unreadable log (``None`` fields instead).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sc_app.io import strict_json
from sc_app.k8s.api import K8sError, Kube

log = logging.getLogger(__name__)

CONTAINER = "preflight"
PRE_RUNNING_DEADLINE = "PreRunningDeadlineExceeded"


@dataclass
class PreflightState:
    step: int | None = None
    decision: str | None = None
    reason: str = ""
    restarts: int = 0
    exit_code: int | None = None

    @property
    def refusing(self) -> bool:
        return self.decision == "refuse" or (self.exit_code not in (None, 0) and self.restarts > 0)

    def refusal_line(self, deadline: Any) -> str | None:
        """One line about a refusing preflight, None otherwise."""
        if not self.refusing:
            return None
        why = self.reason or f"exit {self.exit_code} (see `kubectl logs <head> -c {CONTAINER} --previous`)"
        limit = f"{deadline} s" if deadline else "no deadline (job.preRunningDeadlineSeconds is null: for ever)"
        return (f"preflight refuses to resume (restarted {self.restarts} times): {why}; the workers wait until "
                f"KubeRay fails the attempt at preRunningDeadlineSeconds ({limit}) and the retry refuses again: fix "
                "the cause (ops/RUNBOOKS.md) or `sc-app k8s suspend`")


def _init_status(pod: dict[str, Any]) -> dict[str, Any]:
    for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == CONTAINER:
            return cs
    return {}


def read(kube: Kube, pod: dict[str, Any]) -> PreflightState:
    """The preflight state of one head pod (its status and its init container's log)."""
    cs = _init_status(pod)
    last = ((cs.get("lastState") or {}).get("terminated") or (cs.get("state") or {}).get("terminated") or {})
    state = PreflightState(restarts=int(cs.get("restartCount") or 0),
                           exit_code=int(last["exitCode"]) if "exitCode" in last else None)
    try:
        text = kube.pod_log(pod["metadata"]["name"], CONTAINER)
    except K8sError as exc:  # status must still answer when logs are not readable
        log.debug("preflight log unavailable: %s", exc)
        return state
    start = text.find("{")
    try:
        doc = strict_json.parse(text[start:]) if start >= 0 else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        lines = [ln for ln in text.splitlines() if ln.strip()]
        state.reason = lines[-1].strip()[:300] if lines and state.refusing else ""
        return state
    state.decision = str(doc.get("decision"))
    step = doc.get("step") if state.decision == "resume" else None  # a fresh start reports step 0: no bundle
    state.step = int(step) if step is not None else None
    state.reason = str(doc.get("reason") or "")[:300] if state.decision == "refuse" else ""
    return state
