"""CPU-seconds of every process that takes part in a measurement: this process (the driver, with every thread it
runs — the snapshot's stream writer threads, the io pool) and all its descendants (the local Ray it started: GCS,
raylet, and the worker processes hosting TransferQueue's controller and storage units, the sc-app actors), before
and after: this process by ``getrusage`` (every thread, ended ones too), the others by the ``schedstat`` of each of
their threads (nanoseconds; ``/proc/<pid>/stat`` counts in 10 ms ticks).

A thread of another process that ended inside the span, or a process that started *and* ended in it, is missed (none
does in the bench's sections: the actors are long-lived); idle Ray processes poll, so ``CpuMeter.idle_rate`` (CPU-s
per wall second of the tree at rest) is measured once and ``Sample.busy_s`` subtracts it over each sample's wall
time.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")

# process title (Ray sets ``ray::<Class>.<method>`` on workers) -> role in the tables
ROLES = (
    ("StorageUnit", "storage units"),
    ("TransferQueueController", "TQ controller"),
    ("raylet", "ray system"),
    ("gcs_server", "ray system"),
    ("ray::", "other ray workers"),
)


def _read_stat(pid: int) -> tuple[int, float] | None:
    """``(parent pid, CPU-seconds)`` of ``pid``, or None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def role_of(pid: int, root: int) -> str:
    if pid == root:
        return "driver"
    title = _title(pid)
    for needle, role in ROLES:
        if needle in title:
            return role
    return "other"


def _threads_ns(pid: int) -> float | None:
    """CPU-seconds of ``pid``'s live threads, from each one's ``schedstat`` (nanoseconds: the tick-based
    ``stat`` counts in 10 ms steps, too coarse for a 16 MiB save); None when the process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_bytes().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


def _self_cpu() -> float:
    """This process, every thread including those that ended (the stream writers' pools): ``getrusage``, in µs."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def descendants(root: int) -> list[int]:
    """``root``'s descendants (not ``root``), found through every process's parent in ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _read_stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu(root: int | None = None, *, self_last: bool = True) -> dict[int, float]:
    """CPU-seconds of ``root`` (default: this process) and every descendant, by pid. This process is read with
    ``getrusage`` last (``self_last``, before a span) or first (after one), so reading ``/proc`` is not counted."""
    root = os.getpid() if root is None else root
    out: dict[int, float] = {}
    if root == os.getpid() and not self_last:
        out[root] = _self_cpu()
    for pid in descendants(root):
        cpu = _threads_ns(pid)
        if cpu is not None:
            out[pid] = cpu
    if root == os.getpid() and self_last:
        out[root] = _self_cpu()
    elif root != os.getpid():
        st = _read_stat(root)
        if st is not None:
            out[root] = st[1]
    return out


@dataclass
class Sample:
    """One measured span: wall seconds, CPU-seconds of the whole tree, and per role."""

    wall_s: float
    cpu_s: float
    by_role: dict[str, float] = field(default_factory=dict)
    idle_rate: float = 0.0

    @property
    def busy_s(self) -> float:
        """CPU-seconds less what the tree burns at rest over the same wall time (never below zero)."""
        return max(0.0, self.cpu_s - self.idle_rate * self.wall_s)

    def as_dict(self) -> dict[str, Any]:
        return {"wall_s": self.wall_s, "cpu_s": self.cpu_s, "busy_s": self.busy_s, "by_role": dict(self.by_role)}


class CpuMeter:
    def __init__(self, root: int | None = None) -> None:
        self.root = os.getpid() if root is None else root
        self.idle_rate = 0.0
        self._roles: dict[int, str] = {}

    def _role(self, pid: int) -> str:
        if pid not in self._roles:
            self._roles[pid] = role_of(pid, self.root)
        return self._roles[pid]

    def calibrate(self, seconds: float = 1.0) -> float:
        """Measure the tree's CPU-seconds per wall second while nothing is asked of it."""
        a, t0 = tree_cpu(self.root), time.perf_counter()
        time.sleep(seconds)
        b, t1 = tree_cpu(self.root, self_last=False), time.perf_counter()
        self.idle_rate = sum(b.get(p, 0.0) - a.get(p, 0.0) for p in b) / (t1 - t0)
        return self.idle_rate

    def _sample(self, before: dict[int, float], after: dict[int, float], wall: float) -> Sample:
        by_role: dict[str, float] = {}
        for pid, cpu in after.items():
            used = cpu - before.get(pid, 0.0)
            if used > 0:
                role = self._role(pid)
                by_role[role] = by_role.get(role, 0.0) + used
        return Sample(wall, sum(by_role.values()), by_role, self.idle_rate)

    async def measure(self, fn: Callable[[], Awaitable[Any]]) -> tuple[Sample, Any]:
        """Run ``await fn()`` and return its CPU sample and result."""
        before, t0 = tree_cpu(self.root), time.perf_counter()
        result = await fn()
        wall = time.perf_counter() - t0
        return self._sample(before, tree_cpu(self.root, self_last=False), wall), result

    def measure_sync(self, fn: Callable[[], Any]) -> tuple[Sample, Any]:
        before, t0 = tree_cpu(self.root), time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t0
        return self._sample(before, tree_cpu(self.root, self_last=False), wall), result


def per_gib(samples: list[Sample], nbytes: int) -> dict[str, Any]:
    """CPU-seconds per GiB moved (busy: idle subtracted), median over samples, with each role's median."""
    import statistics

    gib = nbytes / 2**30
    roles = sorted({r for s in samples for r in s.by_role})
    return {
        "cpu_s_per_gib": statistics.median(s.busy_s / gib for s in samples),
        "cpu_s_per_gib_all": [s.busy_s / gib for s in samples],
        "raw_cpu_s_per_gib": statistics.median(s.cpu_s / gib for s in samples),
        "wall_s": statistics.median(s.wall_s for s in samples),
        "by_role": {r: statistics.median(s.by_role.get(r, 0.0) / gib for s in samples) for r in roles},
    }


Setup = Callable[[], Any] | None
Measured = Callable[[], Awaitable[Any]]


async def interleave(meter: CpuMeter, reps: int, cands: dict[str, tuple[Setup, Measured]]) -> dict[str, list[Sample]]:
    """Each candidate once per repetition, in turn (A, B, C, A, B, C, ...): ``setup()`` unmeasured, then
    ``await run()`` measured."""
    out: dict[str, list[Sample]] = {name: [] for name in cands}
    for _ in range(reps):
        for name, (setup, run) in cands.items():
            if setup is not None:
                setup()
            sample, _ = await meter.measure(run)
            out[name].append(sample)
    return out


def cost_rows(samples: dict[str, list[Sample]], nbytes: int, idle_rate: float) -> dict[str, Any]:
    """Per candidate ``per_gib``; the save's and restore's ratios to their baselines (sums of the halves, per
    repetition, then the median)."""
    import statistics

    out: dict[str, Any] = {name: per_gib(s, nbytes) for name, s in samples.items()}
    out["idle_cpu_s_per_s"] = idle_rate
    pairs = {
        "save": ("tq_get", "raw_write"),
        "restore": ("tq_put", "raw_read"),
        "restore_before": ("tq_put", "raw_read"),
    }
    for what, (a, b) in pairs.items():
        if what in samples and a in samples and b in samples:
            ratios = [
                s.busy_s / max(1e-9, x.busy_s + y.busy_s)
                for s, x, y in zip(samples[what], samples[a], samples[b], strict=True)
            ]
            out[f"{what}_over_baseline"] = statistics.median(ratios)
            out[f"{what}_over_baseline_all"] = ratios
    return out
