"""Bounded waits on other processes: no wait of the driver on another process outlives its deadline or a stop.

A plain ``ray.get`` on a call to a process that is alive but not answering (SIGSTOPped, deadlocked, its node
frozen) waits forever: neither a stop request nor the emergency budget can end it. ``get`` waits instead in short
``ray.wait`` slices and, between them, asks whether a stop was requested (``StopCut``) and whether the deadline
passed (``ProcessHung``, a ``JobFailed``: a hung process is treated like a dead one — in-job restore or the
attempt's end per ``run.max_in_job_restores``). A result that is ready is fetched at once, so an error (a dead
actor, a worker's exception) is raised as soon as it is known, not after the slowest of the other calls.

The bound is given per call (``timeout_s``, ``stop``) or, for a whole phase such as the set-up, by the caller
around it (``bounded``): code deep inside that phase (the set-up's worker calls, the data-plane guard) calls
``get(refs, what=...)`` and is bounded by its caller's deadline and stop request. Ray is imported only when no
``wait``/``fetch`` is given: unit tests drive the logic with fakes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sc_app.progress import JobFailed

SLICE_S = 0.5  # longest single ray.wait: how late a stop request or a deadline may be noticed
THREAD_POLL_S = 0.25  # how often ``in_thread`` looks at its bound


class ProcessHung(JobFailed):
    """A process of the job did not answer within its bound (alive but hung); ``kind`` and ``names`` name it as a
    ``FaultRecord`` kind and in words, ``since`` is ``time.time()`` when it was last heard from."""

    def __init__(self, kind: str, names: str, seconds: float, why: str, since: float | None = None) -> None:
        super().__init__(f"{names} did not answer for {seconds:.0f}s ({why})")
        self.kind, self.names, self.seconds = kind, names, seconds
        self.since = since if since is not None else time.time() - seconds


class StopCut(Exception):
    """A stop request cut a wait short (e.g. SIGTERM during the set-up): nothing was lost, the caller stops."""


@dataclass(frozen=True)
class Bound:
    """What ends a wait besides its result: ``until`` (``time.monotonic()``; None: no deadline) and ``stop()``;
    ``why`` names the deadline in the line a hang is reported with (e.g. the config key that set it)."""

    until: float | None = None
    stop: Callable[[], bool] = lambda: False
    why: str = "no answer"

    @classmethod
    def within(cls, seconds: float, stop: Callable[[], bool] = lambda: False, why: str = "") -> Bound:
        return cls(time.monotonic() + seconds, stop, why or f"no answer within {seconds:g}s")

    def capped(self, seconds: float) -> Bound:
        """This bound, ending ``seconds`` from now at the latest (a call with a deadline of its own)."""
        until = time.monotonic() + seconds
        if self.until is not None and self.until <= until:
            return self
        return Bound(until, self.stop, f"no answer within {seconds:g}s")


_BOUND: ContextVar[Bound | None] = ContextVar("sc_app_wait_bound", default=None)


@contextmanager
def bounded(bound: Bound) -> Iterator[None]:
    """Every ``get`` inside (in this thread or task) without a bound of its own is bounded by ``bound``."""
    token = _BOUND.set(bound)
    try:
        yield
    finally:
        _BOUND.reset(token)


def current() -> Bound:
    return _BOUND.get() or Bound()


def stop_before(what: str) -> None:
    """``StopCut`` when the current bound's stop was requested: called before a step that starts processes or
    blocks without looking at the stop (``what`` names it), so a stop that came earlier never waits on it."""
    if current().stop():
        raise StopCut(f"a stop was requested before {what}")


def get(
    refs: Any,
    *,
    what: str,
    kind: str = "controller",
    bound: Bound | None = None,
    slice_s: float = SLICE_S,
    wait: Callable[..., tuple[list[Any], list[Any]]] | None = None,
    fetch: Callable[[list[Any]], list[Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Any:
    """``ray.get(refs)`` (one ref or a list) ended by ``bound`` (default: the caller's, ``bounded``): raises
    ``StopCut`` once ``bound.stop()`` is true, ``ProcessHung(kind, what)`` once ``bound.until`` passed; an error of
    a ready result is raised at once. ``what`` names the process(es) waited on."""
    if wait is None or fetch is None:
        import ray

        wait, fetch = wait or ray.wait, fetch or ray.get
    bound = bound or current()
    single = not isinstance(refs, list | tuple)
    order: Sequence[Any] = [refs] if single else list(refs)
    values: dict[int, Any] = {}
    pending = list(range(len(order)))
    started = clock()
    while pending:
        if bound.stop():
            raise StopCut(f"a stop was requested while waiting for {what}")
        left = slice_s if bound.until is None else min(slice_s, bound.until - clock())
        if left <= 0:
            raise ProcessHung(kind, what, clock() - started, bound.why)
        ready, _ = wait([order[i] for i in pending], num_returns=len(pending), timeout=left)
        if not ready:
            continue
        ready_set = set(ready)
        now_ready = [i for i in pending if order[i] in ready_set]
        for i, value in zip(now_ready, fetch([order[i] for i in now_ready]), strict=True):
            values[i] = value
        pending = [i for i in pending if i not in values]
    out = [values[i] for i in range(len(order))]
    return out[0] if single else out


def in_thread(
    fn: Callable[[], Any],
    *,
    what: str,
    kind: str = "controller",
    bound: Bound | None = None,
    give_up: Callable[[], str | None] = lambda: None,
    poll_s: float = THREAD_POLL_S,
) -> Any:
    """``fn()`` — a call that blocks without a timeout of its own (e.g. into TransferQueue) — on a daemon thread,
    waited for within ``bound`` (default: the caller's): its value, or its error raised as is. Past the bound the
    call is given up on: ``give_up()`` releases what it asked for and may name what it still waited on, then
    ``StopCut`` (a stop) or ``ProcessHung(kind, that name or what)`` is raised; the thread is left to end alone."""
    bound = bound or current()
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the waiting thread
            box.append((False, exc))

    started = time.monotonic()
    thread = threading.Thread(target=run, name=f"bounded: {what}"[:60], daemon=True)
    thread.start()
    while not box:
        thread.join(poll_s)
        if box:  # done (the thread may be an instant from its end)
            break
        if bound.stop():
            give_up()
            raise StopCut(f"a stop was requested while waiting for {what}")
        if bound.until is not None and time.monotonic() >= bound.until:
            names = give_up() or what
            raise ProcessHung(kind, names, time.monotonic() - started, bound.why)
    ok, value = box[0]
    if ok:
        return value
    raise value
