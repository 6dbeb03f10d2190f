"""Pure figures of the in-job restore benches (issue 29): no Ray, no torch, no processes — the verdicts the benches
print, unit-tested in ``tests/unit/test_restore_figures.py``.

* ``Budget``: the figure "restore ≤ the start of one actor + reading the bundle at raw disk speed + 50%", from
  actor starts and a raw read of the bundle's bytes measured in the same bench run, and its verdict per fault kind:
  against the start of one actor *of the kind that died* (``kind_start_s``: what its restore must start again) and,
  as before, against a bare actor that only imports what every sc-app actor imports (``actor_start_s``);
* ``first_rollouts``: resume → first token after each in-job restore, read from the run's trace (``run.trace_file``:
  a ``start`` event where the restored job began, a ``rollout`` event per generate call served);
* ``ratio_verdict``: a figure of one engine against another's (vLLM ≤ 2x HF).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

BUDGET_MARGIN = 1.5  # "+ 50%"


@dataclass(frozen=True)
class Budget:
    """What a restore may cost: (one actor's start + the bundle's bytes read at raw disk speed) x 1.5."""

    actor_start_s: float  # median start of a bare actor importing torch and sc_app.rl.trainer
    bundle_bytes: int
    raw_read_s: float  # median seconds of a raw read of those bytes (page cache dropped)
    kind_start_s: dict[str, float] = field(default_factory=dict)  # fault kind -> median start of one of its actors

    @property
    def seconds(self) -> float:
        """The budget against the bare actor's start (the same for every kind)."""
        return BUDGET_MARGIN * (self.actor_start_s + self.raw_read_s)

    def of_kind(self, kind: str) -> float | None:
        """The budget of a restore of ``kind``: its own actor's start + the raw read, x 1.5 (None: not measured)."""
        start = self.kind_start_s.get(kind)
        return None if start is None else BUDGET_MARGIN * (start + self.raw_read_s)

    @property
    def read_mib_s(self) -> float:
        return self.bundle_bytes / 2**20 / self.raw_read_s if self.raw_read_s > 0 else float("inf")


@dataclass(frozen=True)
class Verdict:
    kind: str
    measured_s: float
    limit_s: float

    @property
    def met(self) -> bool:
        return self.measured_s <= self.limit_s

    def line(self) -> str:
        word = "met" if self.met else "MISSED"
        ratio = self.measured_s / self.limit_s
        return f"{self.kind}: {self.measured_s:.1f} s vs {self.limit_s:.1f} s ({ratio:.2f}x) {word}"


def budget_verdicts(restores: dict[str, dict[str, float]], budget: Budget) -> list[Verdict]:
    """One verdict per fault kind: its median restore seconds (``restores``: kind → {"median", ...}) against the
    bare actor's budget (``Budget.seconds``)."""
    return [Verdict(kind, float(r["median"]), budget.seconds) for kind, r in sorted(restores.items())]


def kind_verdicts(restores: dict[str, dict[str, float]], budget: Budget) -> list[Verdict]:
    """One verdict per fault kind whose actor's start was measured: its median restore seconds against the start of
    one actor of that kind + the raw read, x 1.5 (``Budget.of_kind``)."""
    out = []
    for kind, r in sorted(restores.items()):
        limit = budget.of_kind(kind)
        if limit is not None:
            out.append(Verdict(kind, float(r["median"]), limit))
    return out


def budget_line(budget: Budget) -> str:
    return (
        f"budget {budget.seconds:.1f} s = 1.5 x (bare actor start {budget.actor_start_s:.1f} s + raw read of "
        f"{budget.bundle_bytes / 2**20:.2f} MiB in {budget.raw_read_s:.3f} s, {budget.read_mib_s:.0f} MiB/s)"
    )


def kind_line(budget: Budget) -> str:
    starts = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(budget.kind_start_s.items()))
    return f"start of one actor of the kind that died (median): {starts}; raw read {budget.raw_read_s:.3f} s"


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def first_rollouts(events: list[dict[str, Any]]) -> list[float | None]:
    """Seconds from each in-job restore's resume (every ``start`` event but the first) to the first ``rollout``
    event after it (the first generate call the restored job was served: its tokens; None when none came)."""
    starts = [e["t"] for e in events if e["ev"] == "start"][1:]
    rollouts = sorted(e["t"] for e in events if e["ev"] == "rollout")
    return [next((r - s for r in rollouts if r >= s), None) for s in starts]


def first_rollout_after(events: list[dict[str, Any]], t: float) -> float | None:
    """Seconds from ``t`` (a kill) to the first ``rollout`` event of a job started after it (None: none came)."""
    resumed = min((e["t"] for e in events if e["ev"] == "start" and e["t"] >= t), default=None)
    if resumed is None:
        return None
    return min((e["t"] - t for e in events if e["ev"] == "rollout" and e["t"] >= resumed), default=None)


def ratio_verdict(what: str, measured: float, reference: float, limit: float) -> str:
    """``what``: measured / reference against ``limit`` (e.g. vLLM's resume → first token ≤ 2x HF's)."""
    ratio = measured / reference if reference > 0 else float("inf")
    word = "met" if ratio <= limit else "MISSED"
    return f"{what}: {measured:.2f} s vs {reference:.2f} s = {ratio:.2f}x (target <= {limit:g}x) {word}"
