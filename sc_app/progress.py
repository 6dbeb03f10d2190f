"""What the controller actor reports to the driver, and the driver to the CLI: typed records, one line each.

Pure: no Ray, no torch. The controller appends records in the order things happen; the driver polls them
(``SingleControllerActor.progress``) and hands each to its ``on_progress`` callback; ``format_line`` is the one
place that turns a record into the line ``sc-app run`` prints (tools such as ``sc-app k8s status`` parse those
lines — change them together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepRecord:
    """One train step finished."""

    step: int
    reward: float  # mean reward of the step's groups
    loss: float
    staleness: float  # mean weights versions between generation and training of the trained groups
    rows_held: int  # rows in TransferQueue after the step
    step_seconds: float
    reward_min: float = math.nan  # lowest and highest reward of the step's rows
    reward_max: float = math.nan
    weights_version: int | None = None  # the trainer's weights version after the step
    commit_waits: tuple[float, ...] = ()  # seconds each data-plane commit/drop since the previous step waited at the
    # checkpoint barrier (drained from ``BarrierStats`` with every step)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # where the step went; keys: sc_app/phases.py
    # (not kept in manifests: KEPT_STEP_FIELDS)


KEPT_STEP_FIELDS = (  # what a bundle keeps of each step it covers (the manifest's schema names the same keys)
    "step",
    "reward",
    "loss",
    "staleness",
    "rows_held",
    "step_seconds",
    "reward_min",
    "reward_max",
    "weights_version",
)


def step_summary(record: StepRecord) -> dict[str, float | int | None]:
    """What a bundle keeps of one step it covers: JSON numbers, non-finite ones as null."""
    out: dict[str, float | int | None] = {}
    for key in KEPT_STEP_FIELDS:
        value = getattr(record, key)
        out[key] = None if isinstance(value, float) and not math.isfinite(value) else value
    return out


@dataclass(frozen=True)
class SaveRecord:
    """A bundle was published (renamed to ``step_N/``, or ``on_bucket``)."""

    step: int
    bundle: str
    seconds: float  # whole save, most of it behind training
    paused_seconds: float  # how long training paused for it (the run log's paused_seconds)
    window_seconds: float  # the barrier's exclusive window
    groups: int
    data_plane_bytes: int
    pruned: tuple[str, ...] = ()
    emergency: bool = False  # the bundle cut on a stop request (SIGTERM), not a periodic or final one
    on_bucket: bool = False  # committed on the bucket alone (checkpoint.remote.parts=direct): no local step_N/
    uploaded_bytes: int = 0  # on_bucket: the bytes uploaded for it (the head's files and the ranks' parts)


@dataclass(frozen=True)
class SaveFailedRecord:
    """A save failed and ``checkpoint.on_save_error=continue``: older bundles are intact, training goes on."""

    step: int
    error: str
    in_a_row: int = 1  # consecutive failed saves, this one included
    last_saved_step: int = 0  # the step of the newest bundle this run published (or resumed from)


@dataclass(frozen=True)
class StopRecord:
    """A stop was requested; the bundle of this step is cut next, unless ``emergency`` says why not."""

    step: int
    emergency: str = ""  # the deadline decision (sc_app.checkpoint.emergency), one line


@dataclass(frozen=True)
class FaultRecord:
    """A fault the run met in-job and what it cost (``docs/recovery.md``); one run-log ``fault`` event. The
    prompt counts are what the recovery lost or trained twice: 0 unless ``outcome`` is ``failed``."""

    step: int
    kind: str  # what failed: data_plane.put | .write | .clear | .get | .list | generation.worker | (an in-job
    # restore:) trainer.worker | data_plane.storage | data_plane.controller | controller | node
    outcome: str  # recovered (the run goes on) | rolled_back (gave up, its rows removed) | failed
    attempts: int  # tries made, the successful one included
    detection_seconds: float  # from the call's start until the failure surfaced
    recovery_seconds: float  # from the failure until the call succeeded or gave up
    rows_removed: int = 0
    steps_redone: int = 0
    rollouts_regenerated: int = 0
    prompts_lost: int = 0
    prompts_duplicated: int = 0
    error: str = ""
    restored_step: int | None = None  # an in-job restore: the bundle's step the rebuilt job went on from
    # an in-job restore's ledger: which path ran (warm | full | full after a failed warm reset), the processes
    # started again and the ones reset in place, seconds per phase (detection, fencing, reset, reload), and the
    # calls from before the reset the kept workers refused (sc_app.rl.fencing)
    path: str = ""
    restarted: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()
    phase_seconds: dict[str, float] = field(default_factory=dict)
    stale_refused: int = 0


class JobFailed(RuntimeError):
    """A process of the job died (controller actor, worker, node): restored in-job (``attempt.in_job_restore``) while
    ``run.max_in_job_restores`` allows, else the attempt ends and a rerun resumes from the newest complete bundle."""


class RecoveryExhausted(RuntimeError):
    """An in-job recovery gave up (retries or restarts spent): the run stops with this one line, exit 1, and the
    usual retry path resumes it from the newest bundle."""


@dataclass(frozen=True)
class UploadRecord:
    """A bundle was published on the remote tier (``checkpoint.remote``), or its upload failed (``error``).
    ``step``: the bundle's; ``lag_steps``: newest local bundle's step minus the newest one on the bucket."""

    step: int
    bundle: str
    bytes: int
    seconds: float
    lag_steps: int
    error: str = ""


ProgressRecord = StepRecord | SaveRecord | SaveFailedRecord | StopRecord | FaultRecord | UploadRecord


@dataclass(frozen=True)
class RunSummary:
    """What ``SingleControllerActor.run`` returns when the train pump ends."""

    final_step: int
    weights_version: int
    first_rewards: list[float] = field(default_factory=list)
    last_rewards: list[float] = field(default_factory=list)
    stopped_early: bool = False
    last_saved_step: int = 0  # the step of the newest bundle published (or resumed from) when the run ended
    emergency_skipped: bool = False  # stopped without an emergency bundle: it could not have finished in time

    @property
    def unsaved_steps(self) -> int:
        """Steps trained that no bundle covers: a rerun would redo them."""
        return self.final_step - self.last_saved_step

    @staticmethod
    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0


def format_line(record: ProgressRecord, max_steps: int) -> str:
    """The line ``sc-app run`` prints for ``record``."""
    head = f"step {record.step:>4}/{max_steps}"
    if isinstance(record, StepRecord):
        return (
            f"{head}  reward {record.reward:.3f}  loss {record.loss:+.4f}  staleness {record.staleness:.2f}  "
            f"rows_in_tq {record.rows_held:>4}  {record.step_seconds:.2f}s"
        )
    if isinstance(record, SaveRecord):
        return (
            f"{head}  saved {record.bundle} ({record.seconds:.2f}s, training paused "
            f"{record.paused_seconds * 1000:.0f} ms, window {record.window_seconds * 1000:.0f} ms)"
        )
    if isinstance(record, SaveFailedRecord):
        if record.in_a_row > 1:
            newest = f"step_{record.last_saved_step}" if record.last_saved_step else "none"  # no bundle at step 0
            return (
                f"{head}  SAVE FAILED ({record.in_a_row} in a row; newest bundle {newest}, "
                f"{record.step - record.last_saved_step} steps behind): {record.error}"
            )
        return f"{head}  SAVE FAILED: {record.error}"
    if isinstance(record, UploadRecord):
        if record.error:
            return f"{head}  upload of {record.bundle} failed (retried): {record.error}"
        return (
            f"{head}  uploaded {record.bundle} ({record.bytes / 2**20:.1f} MiB in {record.seconds:.2f}s, "
            f"remote {record.lag_steps} steps behind)"
        )
    if isinstance(record, FaultRecord):
        redo = (
            ""
            if record.restored_step is None
            else (
                f", restored step_{record.restored_step}, {record.steps_redone} steps to redo"
                + (
                    f", {record.path}: restarted {len(record.restarted)}, reset {len(record.reset)}"
                    if record.path
                    else ""
                )
            )
        )
        return (
            f"{head}  fault {record.kind}: {record.outcome} after {record.attempts} attempts (detected "
            f"{record.detection_seconds:.3f}s, recovery {record.recovery_seconds:.3f}s{redo}): {record.error}"
        )
    return f"{head}  stop requested"
