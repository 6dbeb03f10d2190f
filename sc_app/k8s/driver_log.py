"""What the running driver has done, read from its stdout (the lines ``sc-app run`` prints, see ``sc_app/cli/run.py``).

Invariant: every pattern for a driver line lives in ``PATTERNS`` below and nowhere else, so a change of the driver's
format breaks ``tests/k8s/test_k8s_cli.py`` (which parses a real driver's output) instead of silently emptying
``sc-app k8s status``. Lines that match no pattern (Ray's own output, log records) are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_STEP = r"^step\s+(?P<step>\d+)/(?P<max_steps>\d+)\s+"

# kind → pattern of one driver line. Kinds other than "progress" are events.
PATTERNS: dict[str, re.Pattern[str]] = {
    "progress": re.compile(_STEP + r"reward\s+(?P<reward>\S+)\s+loss\s+(?P<loss>\S+)\s+staleness\s+\S+"),
    "saved": re.compile(_STEP + r"saved\s+(?P<bundle>step_(?P<bundle_step>\d+))\s+\((?P<seconds>[\d.]+)s\b"),
    "save_failed": re.compile(_STEP + r"SAVE FAILED: (?P<detail>.*)$"),
    "stop_requested": re.compile(_STEP + r"stop requested$"),
    "resumed": re.compile(r"^resuming from (?P<bundle>.+?) \(step (?P<bundle_step>\d+)\): (?P<detail>.*)$"),
    "fresh": re.compile(r"^starting fresh: (?P<detail>.*)$"),
    "signal": re.compile(r"^received (?P<signal>SIG[A-Z0-9]+): (?P<detail>.*)$"),
    "quarantined": re.compile(r"^quarantined (?P<detail>.+)$"),
    "started": re.compile(r"^sc-app (?P<version>\S+): max_steps=(?P<max_steps>\d+) "),
    "done": re.compile(r"^done: step (?P<step>\d+)\b"),
    "stopped": re.compile(r"^stopped: step (?P<step>\d+) saved on request"),
    "error": re.compile(r"^sc-app: error: (?P<detail>.*)$"),
}


@dataclass(frozen=True)
class DriverEvent:
    """One driver line that is not a per-step progress line, as printed."""

    kind: str
    line: str


@dataclass
class DriverProgress:
    """The driver's state as far as its output shows.

    ``step``: the newest train step reported. ``newest_bundle_step``: the newest bundle this driver published, else
    the one it resumed from (``newest_bundle_source`` says which), else None. ``events``: the last events, oldest first.
    """

    step: int | None = None
    max_steps: int | None = None
    newest_bundle_step: int | None = None
    newest_bundle_source: str | None = None  # "saved" | "resumed"
    resumed_from_step: int | None = None
    fresh_start: bool = False
    events: list[DriverEvent] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "maxSteps": self.max_steps,
            "newestBundleStep": self.newest_bundle_step,
            "newestBundleSource": self.newest_bundle_source,
            "resumedFromStep": self.resumed_from_step,
            "freshStart": self.fresh_start,
            "events": [{"kind": e.kind, "line": e.line} for e in self.events],
        }


def classify(line: str) -> tuple[str, re.Match[str]] | None:
    """(kind, match) for one driver line, or None when it is not one of the driver's lines."""
    text = line.strip()
    for kind, pattern in PATTERNS.items():
        m = pattern.match(text)
        if m:
            return kind, m
    return None


def parse(text: str, *, last_events: int = 5) -> DriverProgress:
    """Fold a driver's output (oldest line first) into a ``DriverProgress`` keeping the last ``last_events`` events."""
    out = DriverProgress()
    events: list[DriverEvent] = []
    for raw in text.splitlines():
        found = classify(raw)
        if found is None:
            continue
        kind, m = found
        groups = m.groupdict()
        if groups.get("max_steps"):
            out.max_steps = int(groups["max_steps"])
        if kind == "progress":
            out.step = max(out.step or 0, int(groups["step"]))
            continue
        if kind == "started":  # a new driver in the same log: what the older one did is history
            out = DriverProgress(max_steps=int(groups["max_steps"]))
        events.append(DriverEvent(kind, raw.strip()))
        if kind == "saved":
            bundle_step = int(groups["bundle_step"])
            if out.newest_bundle_source != "saved" or bundle_step > (out.newest_bundle_step or -1):
                out.newest_bundle_step, out.newest_bundle_source = bundle_step, "saved"
        elif kind == "resumed":
            out.resumed_from_step = int(groups["bundle_step"])
            out.newest_bundle_step, out.newest_bundle_source = out.resumed_from_step, "resumed"
            out.step = max(out.step or 0, out.resumed_from_step)
        elif kind == "fresh":
            out.fresh_start = True
        elif kind in ("done", "stopped"):
            out.step = max(out.step or 0, int(groups["step"]))
    out.events = events[-last_events:] if last_events > 0 else []
    return out
