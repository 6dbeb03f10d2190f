"""TensorBoard scalars for the run log: the same figures as ``metrics.jsonl``, in event files beside it.

Written with ``torch.utils.tensorboard.SummaryWriter`` (the ``tensorboard`` package provides the format, the
reader and the viewer: ``tensorboard --logdir <log_dir>``). Each attempt writes its own event file into the same
directory; an attempt that trains steps an earlier attempt already logged opens its writer with
``purge_step = first redone step``, so TensorBoard drops the older attempt's points from there on and shows every
step once — the same rule as the ``redone`` mark in ``metrics.jsonl``.

Only the run-log thread calls this (never the driver's loop): a slow volume may block it, nothing else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sc_app.observe.records import SAVE_EVENTS, LoggedEvent, LoggedStep

# metrics.jsonl field -> TensorBoard tag
STEP_TAGS = {
    "reward_mean": "train/reward_mean",
    "reward_min": "train/reward_min",
    "reward_max": "train/reward_max",
    "loss": "train/loss",
    "staleness": "train/staleness",
    "rows_held": "train/rows_in_tq",
    "step_seconds": "train/step_seconds",
    "weights_version": "train/weights_version",
    "commit_wait_p99_s": "train/commit_wait_p99_seconds",
}
SAVE_TAGS = {
    "seconds": "save/seconds",
    "paused_seconds": "save/paused_seconds",
    "window_seconds": "save/window_seconds",
    "bytes": "save/bundle_bytes",
}
ATTEMPT_TAG = "run/attempt"  # one point per attempt, at the step it started from: where resumes happened


class ScalarWriter:
    """A ``SummaryWriter`` for one attempt. ``purge_step``: the first step this attempt logs again (or None)."""

    def __init__(self, log_dir: Path, *, purge_step: int | None, flush_secs: int = 5) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only in the run-log thread

        self._w: Any = SummaryWriter(str(log_dir), purge_step=purge_step, flush_secs=flush_secs)

    def step(self, logged: LoggedStep) -> None:
        rec, t = logged.record, logged.stamp.t
        for name, tag in STEP_TAGS.items():
            value = getattr(rec, name)
            if value is not None:
                self._w.add_scalar(tag, float(value), rec.step, walltime=t)

    def event(self, logged: LoggedEvent) -> None:
        step, t = logged.step, logged.stamp.t
        if step is None:
            return
        if logged.name in SAVE_EVENTS:
            for name, tag in SAVE_TAGS.items():
                value = logged.data.get(name)
                if isinstance(value, int | float):
                    self._w.add_scalar(tag, float(value), step, walltime=t)
        elif logged.name == "start":
            self._w.add_scalar(ATTEMPT_TAG, float(logged.stamp.attempt), step, walltime=t)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()
