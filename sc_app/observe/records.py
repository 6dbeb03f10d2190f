"""What one line of the run log (``<log_dir>/metrics.jsonl``) holds. Pure: no Ray, no torch, no I/O.

Every line is one JSON object with a common head — ``v`` (schema), ``kind`` (``step`` | ``event``), ``t`` (unix
seconds when the driver received it), ``run_id`` and ``attempt`` (the checkpoint lease's epoch: one per try of
the job) — followed by the record's own fields:

* a train step: ``step``, ``redone`` (true when an earlier attempt already logged this step: the job resumed from
  an older bundle and trains it again; the newest attempt's record is the one that counts), ``reward_mean``,
  ``reward_min``, ``reward_max``, ``loss``, ``staleness``, ``rows_held`` (rows in TransferQueue), ``step_seconds``,
  ``weights_version`` and, when the controller measured them, ``commit_wait_p99_s`` / ``commit_wait_max_s``;
* an event: ``event`` (one of ``EVENT_NAMES``), ``step`` (the train step it happened at, or null) and the event's
  own fields.

Non-finite numbers (a NaN loss) are written as ``null``: every line stays valid JSON for ``jq`` and friends.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from sc_app.io import strict_json
from sc_app.progress import StepRecord

SCHEMA_VERSION = 1
LOG_FILE = "metrics.jsonl"
DEFAULT_LOG_SUBDIR = "logs"  # run.log_dir defaults to <checkpoint.dir>/logs

EventName = Literal[
    "start",  # the attempt began: decision (fresh | resume), max_steps, save_period; high_water (stamped by the writer)
    "resume",  # resumed from a bundle: bundle, reason
    "quarantine",  # bundles or leftovers moved to quarantine/: moved
    "lease_taken",  # this attempt holds the checkpoint dir: epoch, previous_run_id
    "lease_lost",  # a newer attempt took the checkpoint dir: message
    "save",  # a bundle was published: bundle, seconds, paused_seconds, window_seconds, bytes, groups[, on_bucket]
    "emergency_save",  # the bundle cut on SIGTERM was published (same fields as save)
    "save_failed",  # a save failed (e.g. full disk), older bundles intact: error, in_a_row, last_saved_step
    "prune",  # retention removed bundles: removed
    "upload",  # a bundle was published on the remote tier: bundle, bytes, seconds, lag_steps
    "upload_failed",  # a remote-tier upload failed (retried): bundle, error, lag_steps
    "stop_requested",  # SIGTERM: finish the step, cut a bundle, exit 143
    "dropped",  # records the writer could not keep (buffer full, write failed) since the last such line
    "recovered",  # steps an earlier attempt trained but never logged (killed first), from its bundle: steps
    "fault",  # a fault met in-job and its cost: fault (what failed), outcome, attempts, detection_s, recovery_s
    "goodput",  # where the attempt's wall time went (sc_app.observe.goodput): goodput, seconds by bucket
    "exit",  # the attempt ended: code, message, final_step; dropped (totals, stamped by the writer)
]
EVENT_NAMES: tuple[str, ...] = get_args(EventName)
SAVE_EVENTS = ("save", "emergency_save")

_HEAD = ("v", "kind", "t", "run_id", "attempt")


@dataclass(frozen=True)
class StepMetrics:
    """The figures of one train step that a run-log line carries (and the metrics record): the controller's
    ``progress.StepRecord``, its commit waits summarised."""

    step: int
    reward_mean: float
    reward_min: float
    reward_max: float
    loss: float
    staleness: float
    rows_held: int
    step_seconds: float
    weights_version: int | None
    commit_wait_p99_s: float | None = None
    commit_wait_max_s: float | None = None
    phase_seconds: dict[str, float] | None = None  # where the step's time went (keys: ``sc_app.phases``)

    @classmethod
    def of(cls, rec: StepRecord) -> StepMetrics:
        waits = sorted(rec.commit_waits)
        return cls(
            step=rec.step,
            reward_mean=rec.reward,
            reward_min=rec.reward_min,
            reward_max=rec.reward_max,
            loss=rec.loss,
            staleness=rec.staleness,
            rows_held=rec.rows_held,
            step_seconds=rec.step_seconds,
            weights_version=rec.weights_version,
            commit_wait_p99_s=nearest_rank(waits, 0.99),
            commit_wait_max_s=waits[-1] if waits else None,
            phase_seconds=dict(rec.phase_seconds) or None,
        )


def nearest_rank(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``ordered`` by the nearest-rank method (an observed value); None when empty."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Event:
    """Something that happened to the run; ``data`` keys may not shadow the line's head or ``event``/``step``."""

    name: EventName
    step: int | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name not in EVENT_NAMES:
            raise ValueError(f"unknown run-log event {self.name!r}; one of {', '.join(EVENT_NAMES)}")
        clash = set(self.data) & {*_HEAD, "event", "step"}
        if clash:
            raise ValueError(f"event {self.name!r}: data keys {sorted(clash)} shadow the line's own fields")


@dataclass(frozen=True)
class Stamp:
    """The head every line carries: who wrote it and when."""

    t: float
    run_id: str
    attempt: int


@dataclass(frozen=True)
class LoggedStep:
    stamp: Stamp
    record: StepMetrics
    redone: bool

    @property
    def step(self) -> int:
        return self.record.step


@dataclass(frozen=True)
class LoggedEvent:
    stamp: Stamp
    event: Event

    @property
    def name(self) -> str:
        return self.event.name

    @property
    def step(self) -> int | None:
        return self.event.step

    @property
    def data(self) -> Mapping[str, Any]:
        return self.event.data


Logged = LoggedStep | LoggedEvent


def finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(finite(obj), separators=(",", ":"), allow_nan=False, default=str) + "\n"


def encode_step(rec: StepMetrics, stamp: Stamp, *, redone: bool) -> str:
    """One ``metrics.jsonl`` line (with its newline) for a train step."""
    head = {"v": SCHEMA_VERSION, "kind": "step", **asdict(stamp)}
    body = asdict(rec)
    step = body.pop("step")
    return _dumps({**head, "step": step, "redone": redone, **body})


def encode_event(ev: Event, stamp: Stamp) -> str:
    """One ``metrics.jsonl`` line (with its newline) for an event."""
    head = {"v": SCHEMA_VERSION, "kind": "event", **asdict(stamp)}
    return _dumps({**head, "event": ev.name, "step": ev.step, **dict(ev.data)})


_STEP_FIELDS = {f.name for f in fields(StepMetrics)}
_STEP_REQUIRED = {f.name for f in fields(StepMetrics) if f.default is MISSING}


class RecordError(ValueError):
    """A line that is not a run-log record of a schema this version reads."""


MAX_STEP = 2**53  # a step or count beyond this is no record sc-app wrote


def _bounded_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_STEP:
        raise ValueError(f"{key} {str(value)[:20]!r} is not a step count")
    return int(value)


def decode(line: str) -> Logged:
    """Parse one line; ``RecordError`` for a torn, foreign or newer-schema line."""
    try:
        obj = strict_json.parse(line.encode("utf-8", "surrogatepass"))
    except ValueError as exc:  # any depth, any number size: one RecordError
        raise RecordError(str(exc)) from None
    if not isinstance(obj, dict):
        raise RecordError("not a JSON object")
    if obj.get("v") != SCHEMA_VERSION:
        raise RecordError(f"schema version {obj.get('v')!r}, this sc-app reads {SCHEMA_VERSION}")
    try:
        stamp = Stamp(t=float(obj["t"]), run_id=str(obj["run_id"]), attempt=int(obj["attempt"]))
        if obj["kind"] == "step":
            values = {k: obj[k] if k in _STEP_REQUIRED else obj.get(k) for k in _STEP_FIELDS}
            for k in ("reward_mean", "reward_min", "reward_max", "loss", "staleness", "step_seconds"):
                values[k] = math.nan if values[k] is None else float(values[k])
            for k in ("step", "rows_held"):
                values[k] = _bounded_int(values[k], k)
            if values["weights_version"] is not None:
                values["weights_version"] = int(values["weights_version"])
            phases = values["phase_seconds"]
            if phases is not None:
                values["phase_seconds"] = {str(k): float(v) for k, v in dict(phases).items()}
            rec = StepMetrics(**values)
            return LoggedStep(stamp, rec, bool(obj.get("redone", False)))
        if obj["kind"] == "event":
            data = {k: v for k, v in obj.items() if k not in {*_HEAD, "event", "step"}}
            step = obj.get("step")
            return LoggedEvent(
                stamp, Event(str(obj["event"]), None if step is None else _bounded_int(step, "step"), data)
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordError(f"malformed record ({type(exc).__name__}: {exc})") from None
    raise RecordError(f"unknown kind {obj.get('kind')!r}")
