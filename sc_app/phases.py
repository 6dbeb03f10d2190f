"""Where a train step's time goes: the keys of ``StepRecord.phase_seconds`` and the clock that fills them.

Pure: no Ray, no torch. Every value is seconds. Three kinds of key:

* the train pump's critical path — these add up to ``StepRecord.step_seconds``:
  ``wait_rollouts`` (waiting for enough fresh groups: generation is behind), ``get`` (the advantage stage reads the
  rewards back), ``advantage_write`` (it writes the advantages onto the same rows, incl. any wait for a save's
  thaw), ``trainer`` (the trainers' ``train_step``, their own reads of the rows included), ``clear`` (dropping the
  trained and the stale groups, barrier waits included), ``weight_sync`` (trainer → generators), and
  ``controller`` (everything else: the controller's own bookkeeping and its share of a busy event loop);
* parts of those, not to be added again: ``trainer_get`` (the trainers' read of their rows, slowest rank, part of
  ``trainer``) and ``barrier_wait`` (this step's drops waiting for a barrier slot, part of ``clear``);
* concurrent with the step, summed over the rollout pumps since the previous step record: ``generation``
  (generate calls that finished), ``put`` (their commits, barrier waits included) and ``put_barrier_wait``.

``data_plane_seconds`` is the step's data-plane time: put + get + advantage_write + trainer_get + clear. ``put``
runs beside the step rather than on its path, so counting it makes the share an upper bound.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

CRITICAL = ("wait_rollouts", "get", "advantage_write", "trainer", "clear", "weight_sync", "controller")
PARTS = ("trainer_get", "barrier_wait")
CONCURRENT = ("generation", "put", "put_barrier_wait")
DATA_PLANE = ("put", "get", "advantage_write", "trainer_get", "clear")
ALL = CRITICAL + PARTS + CONCURRENT


def data_plane_seconds(phases: Mapping[str, float]) -> float:
    """Seconds of the step spent in data-plane calls (the keys in ``DATA_PLANE``)."""
    return sum(phases.get(key, 0.0) for key in DATA_PLANE)


class StepClock:
    """Laps of one train step: ``lap(name)`` charges the time since the previous lap (or the start) to ``name``;
    ``add`` charges a measured amount and ``move`` re-labels part of one key as another. ``finish`` charges what no
    lap claimed to ``controller`` so the critical keys add up to the step's seconds."""

    def __init__(self) -> None:
        self.started = self._last = time.perf_counter()
        self.phases: dict[str, float] = dict.fromkeys(ALL, 0.0)

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] += now - self._last
        self._last = now

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] += seconds

    def move(self, source: str, target: str, seconds: float) -> None:
        """Charge ``seconds`` of what ``source`` holds to ``target`` instead (at most what ``source`` holds)."""
        seconds = max(0.0, min(seconds, self.phases[source]))
        self.phases[source] -= seconds
        self.phases[target] += seconds

    def finish(self) -> tuple[float, dict[str, float]]:
        """``(step seconds, phases)``; ``controller`` gets the time no lap claimed."""
        total = time.perf_counter() - self.started
        claimed = sum(self.phases[key] for key in CRITICAL if key != "controller")
        self.phases["controller"] = max(0.0, total - claimed)
        return total, dict(self.phases)
