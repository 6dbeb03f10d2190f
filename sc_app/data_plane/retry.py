"""In-job recovery of a failed data-plane call: bounded retries with backoff, and a failed put leaves no row behind.

``RetryingClient`` wraps any ``DataPlaneClient`` (the controller wraps TransferQueue's). Every call is idempotent
when retried as it is done here:

* ``put`` (a commit creates rows): a put of the same ids with the same data writes the same rows again (TransferQueue
  looks the keys up, creating only the missing ones). When every attempt failed, the rows the call may have written
  — the index does not list them, it adds a batch only after its put returned — are removed (the ids still stored,
  cleared by key), so the next checkpoint's inventory check (index == stored rows) holds; then it raises
  ``DataPlaneCallFailed``.
* ``write`` (the advantage stage puts a field onto rows the index lists, by global index): rewriting the same values
  is the same state; the indexes stay valid (a drop waits for writes in flight).
* ``clear``: a retry clears, by key, only the ids still stored — never by global index, since indexes freed by the
  partial clear may already belong to a concurrent commit's rows.
* ``get`` and ``list``: reads.

Arguments a call refuses (``ValueError``, ``TypeError``) are not retried: the same call fails the same way.
``fence()`` (the controller's ``halt`` before a warm in-job restore) ends the client: every call from then on, a
retry of a call in flight included, raises ``DataPlaneDetached`` and reaches no data plane — what the old run
still does (a save left to end on its own: its ``thaw()`` clear) never lands on the rebuilt one.
Each fault is reported once through ``on_fault`` (a ``DataPlaneFault``: what, outcome, attempts, seconds to detect
and to recover, rows removed), and counted in ``stats``. Pure: no Ray, no torch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from sc_app.data_plane.client import CapturedRows, DataPlaneClient, DataPlaneDetached, DataPlaneSnapshot
from sc_app.progress import FaultRecord, RecoveryExhausted

if TYPE_CHECKING:
    from tensordict import TensorDict

log = logging.getLogger(__name__)

T = TypeVar("T")
Op = Literal["put", "write", "clear", "get", "list"]
Outcome = Literal["recovered", "rolled_back", "failed"]
NOT_TRANSIENT: tuple[type[BaseException], ...] = (ValueError, TypeError, DataPlaneDetached)


class DataPlaneCallFailed(RecoveryExhausted):
    """A data-plane call failed on every attempt (what it wrote was removed where it could be)."""


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all (1: no retry); the wait before retry ``k`` (1-based) is
    ``min(backoff_s * 2**(k-1), max_backoff_s)``."""

    attempts: int = 4
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"retry policy needs attempts >= 1 and non-negative waits, got {self}")

    def wait_before(self, retry: int) -> float:
        return min(self.backoff_s * 2 ** (retry - 1), self.max_backoff_s)


def policy_of(retries: int, backoff_s: float) -> RetryPolicy:
    """``data_plane.retries`` / ``data_plane.retry_backoff_s`` as a policy."""
    return RetryPolicy(attempts=retries + 1, backoff_s=backoff_s)


@dataclass(frozen=True)
class DataPlaneFault:
    """One data-plane call that raised at least once, and what recovering from it cost."""

    op: Op
    outcome: Outcome  # recovered (a retry succeeded) | rolled_back (gave up, its rows removed) | failed
    attempts: int  # tries made, the successful one included
    rows: int  # rows the call was about
    detection_seconds: float  # from the call's start until its first failure surfaced
    recovery_seconds: float  # from the first failure until the call succeeded or gave up (backoff included)
    rows_removed: int = 0  # rows a failed put had written that were removed again
    error: str = ""  # the first failure, one line

    @property
    def kind(self) -> str:
        return f"data_plane.{self.op}"

    def record(self, step: int) -> FaultRecord:
        """The progress record the controller reports at ``step``. A data-plane retry redoes no step and
        regenerates no rollout; a put given up on loses its batch's prompts only as the run stops (``failed``)."""
        return FaultRecord(
            step=step,
            kind=self.kind,
            outcome=self.outcome,
            attempts=self.attempts,
            detection_seconds=self.detection_seconds,
            recovery_seconds=self.recovery_seconds,
            rows_removed=self.rows_removed,
            error=self.error,
        )


@dataclass
class RetryStats:
    """Counts since the client was built: faults by op and outcome, retries by op."""

    faults: Counter[tuple[str, str]] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class RetryingClient(DataPlaneClient):
    """``inner`` with bounded, backed-off retries and roll-back of failed puts (the module docstring)."""

    def __init__(
        self,
        inner: DataPlaneClient,
        policy: RetryPolicy | None = None,
        *,
        on_fault: Callable[[DataPlaneFault], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.inner = inner
        self.bootstrap = inner.bootstrap
        self.policy = policy or RetryPolicy()
        self.stats = RetryStats()
        self._on_fault = on_fault
        self._sleep = sleep
        self._fenced: str | None = None  # why this client was fenced (``fence``); None: in use

    def fence(self, why: str) -> None:
        """No call goes through this client from now on (``DataPlaneDetached``), retries of calls in flight
        included."""
        self._fenced = why

    def _admit(self) -> None:
        if self._fenced is not None:
            raise DataPlaneDetached(f"data-plane client fenced: {self._fenced}")

    def __getattr__(self, name: str) -> Any:  # adapter extras (snapshot kind, last restore, sync reads)
        return getattr(self.__dict__["inner"], name)

    # -- the retry loop ----------------------------------------------------------------------------------------
    async def _call(
        self, op: Op, rows: int, fn: Callable[[int], Awaitable[T]], give_up: Callable[[], Awaitable[int]] | None = None
    ) -> T:
        """``fn(attempt)`` until it returns or the attempts are spent; ``give_up`` then cleans up (rows removed)."""
        started = time.perf_counter()
        failed_at: float | None = None
        first: BaseException | None = None
        for attempt in range(1, self.policy.attempts + 1):
            try:
                self._admit()
                result = await fn(attempt)
            except NOT_TRANSIENT:
                raise
            except Exception as exc:
                if failed_at is None:
                    failed_at, first = time.perf_counter(), exc
                log.warning(
                    "data-plane %s of %d rows failed (attempt %d/%d): %s",
                    op,
                    rows,
                    attempt,
                    self.policy.attempts,
                    _one_line(exc),
                )
                if attempt < self.policy.attempts:
                    self.stats.retries[op] += 1
                    await self._sleep(self.policy.wait_before(attempt))
                continue
            if failed_at is not None:
                self._report(op, "recovered", attempt, rows, started, failed_at, first)
            return result
        assert failed_at is not None and first is not None
        removed, outcome = 0, "failed"
        if give_up is not None:
            try:
                removed, outcome = await give_up(), "rolled_back"
            except Exception as exc:  # the run stops anyway; say that rows may be left behind
                log.error("data-plane %s: removing its rows failed too (%s)", op, _one_line(exc))
        self._report(op, outcome, self.policy.attempts, rows, started, failed_at, first, removed)  # type: ignore[arg-type]
        raise DataPlaneCallFailed(
            f"data-plane {op} of {rows} rows failed {self.policy.attempts} times ({_one_line(first)})"
            + (f"; the {removed} rows it had written were removed" if outcome == "rolled_back" else "")
        ) from first

    def _report(
        self,
        op: Op,
        outcome: Outcome,
        attempts: int,
        rows: int,
        started: float,
        failed_at: float,
        first: BaseException | None,
        removed: int = 0,
    ) -> None:
        now = time.perf_counter()
        fault = DataPlaneFault(
            op,
            outcome,
            attempts,
            rows,
            failed_at - started,
            now - failed_at,
            removed,
            _one_line(first) if first else "",
        )
        self.stats.faults[(op, outcome)] += 1
        log.warning("data-plane %s: %s after %d attempts (%.3fs)", op, outcome, attempts, fault.recovery_seconds)
        if self._on_fault is not None:
            self._on_fault(fault)

    async def _still_stored(self, partition: str, sample_ids: list[str]) -> list[str]:
        listing = await self.inner.list_samples(partition)
        return [sid for sid in sample_ids if sid in listing]

    async def _remove(self, partition: str, sample_ids: list[str]) -> int:
        """Clear, by key, those of ``sample_ids`` still stored (retried as a clear); the number cleared."""
        present = await self._still_stored(partition, sample_ids)
        if present:
            await self._call("clear", len(present), lambda _: self.inner.clear_samples(partition, present))
        return len(present)

    # -- DataPlaneClient ----------------------------------------------------------------------------------------
    async def put_samples(
        self,
        partition: str,
        sample_ids: list[str],
        data: TensorDict,
        tags: list[dict[str, Any]] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> list[int] | None:
        ids = list(sample_ids)
        if global_indexes is not None:  # onto rows the index lists: rewrite until it lands, remove nothing
            return await self._call(
                "write",
                len(ids),
                lambda _: self.inner.put_samples(partition, ids, data, tags, global_indexes=global_indexes),
            )
        return await self._call(
            "put",
            len(ids),
            lambda _: self.inner.put_samples(partition, ids, data, tags),
            give_up=lambda: self._remove(partition, ids),
        )

    async def clear_samples(
        self, partition: str, sample_ids: list[str], *, global_indexes: list[int] | None = None
    ) -> None:
        ids = list(sample_ids)

        async def attempt(k: int) -> None:
            if k == 1:
                await self.inner.clear_samples(partition, ids, global_indexes=global_indexes)
                return
            present = await self._still_stored(partition, ids)  # by key: freed indexes may be reused already
            if present:
                await self.inner.clear_samples(partition, present)

        await self._call("clear", len(ids), attempt)

    async def get_samples(
        self,
        partition: str,
        sample_ids: list[str],
        field_names: list[str] | None = None,
        *,
        global_indexes: list[int] | None = None,
    ) -> TensorDict:
        return await self._call(
            "get",
            len(sample_ids),
            lambda _: self.inner.get_samples(partition, sample_ids, field_names, global_indexes=global_indexes),
        )

    async def list_samples(self, partition: str) -> dict[str, dict[str, Any]]:
        return await self._call("list", 0, lambda _: self.inner.list_samples(partition))

    async def save_checkpoint(
        self, directory: Path, metadata: dict[str, Any], partition: str, captured: CapturedRows
    ) -> DataPlaneSnapshot:
        self._admit()
        return await self.inner.save_checkpoint(directory, metadata, partition, captured)

    def load_checkpoint(self, directory: Path) -> dict[str, Any]:
        self._admit()
        return self.inner.load_checkpoint(directory)

    def seal(self, info: dict[str, Any]) -> None:
        self._admit()
        self.inner.seal(info)
