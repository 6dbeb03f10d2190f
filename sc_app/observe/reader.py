"""Read a run log back across attempts. Pure apart from reading the file.

The effective series has one record per step: where several attempts logged a step (a resume from an older
bundle trained it again, or a superseded attempt was still dying), the newest attempt's record counts — the same
record the writer did not mark as ``redone``. Lines that cannot be read (a line torn by a SIGKILL, a newer schema)
are skipped and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sc_app.io.safe_files import FileMissing, open_regular
from sc_app.observe.records import (
    LOG_FILE,
    SAVE_EVENTS,
    LoggedEvent,
    LoggedStep,
    RecordError,
    decode,
)

MISSING_LISTED = 1000  # missing steps listed at most (the count is exact)
MAX_LINE_BYTES = 1 << 20  # a run-log record is well under 1 KiB


class RunLogMissing(FileNotFoundError):
    """No run log where one was expected; ``str()`` is one line saying where it looked."""


@dataclass
class Attempt:
    """One try of the job, as its events describe it."""

    attempt: int
    run_id: str
    started_t: float | None = None
    start_step: int | None = None  # the step it trained from (None when its start event was lost)
    resumed_from: str | None = None  # bundle name; None for a fresh start
    exit_code: int | None = None  # None: it never logged an exit (killed, or still running)
    final_step: int | None = None


@dataclass
class RunHistory:
    path: Path
    steps: list[LoggedStep] = field(default_factory=list)  # every step line, in file order
    events: list[LoggedEvent] = field(default_factory=list)  # every event line, in file order
    skipped: int = 0  # lines that could not be read

    def effective_steps(self) -> list[LoggedStep]:
        """One record per step, the newest attempt's (then the latest written), ordered by step."""
        best: dict[int, LoggedStep] = {}
        for s in self.steps:
            cur = best.get(s.step)
            if cur is None or (s.stamp.attempt, s.stamp.t) >= (cur.stamp.attempt, cur.stamp.t):
                best[s.step] = s
        return [best[k] for k in sorted(best)]

    def events_named(self, *names: str) -> list[LoggedEvent]:
        return [e for e in self.events if e.name in names]

    def saves(self) -> list[LoggedEvent]:
        """Published bundles (periodic, final and emergency), in the order they were logged."""
        return self.events_named(*SAVE_EVENTS)

    def missing_steps(self, limit: int = MISSING_LISTED) -> list[int]:
        """The first ``limit`` steps between 1 and the last one logged that no attempt logged (e.g. dropped on a
        slow volume). Walks the gaps, never the range: a step of 10**12 costs nothing."""
        out: list[int] = []
        prev = 0
        for step in sorted({s.step for s in self.steps if s.step >= 1}):
            out.extend(range(prev + 1, min(step, prev + 1 + limit - len(out))))
            if len(out) >= limit:
                break
            prev = step
        return out

    def missing_count(self) -> int:
        """How many steps ``missing_steps`` would list without a limit."""
        have = sorted({s.step for s in self.steps if s.step >= 1})
        return (have[-1] - len(have)) if have else 0

    def attempts(self) -> list[Attempt]:
        by: dict[int, Attempt] = {}
        for item in [*self.events, *self.steps]:
            by.setdefault(item.stamp.attempt, Attempt(item.stamp.attempt, item.stamp.run_id))
        for e in self.events:
            a = by[e.stamp.attempt]
            if e.name == "start":
                a.started_t, a.start_step = e.stamp.t, e.step
            elif e.name == "resume":
                a.resumed_from = e.data.get("bundle")
            elif e.name == "exit":
                a.exit_code = e.data.get("code")
                a.final_step = e.data.get("final_step", e.step)
        return [by[n] for n in sorted(by)]


def log_file(where: str | Path) -> Path:
    """``metrics.jsonl`` of a log directory, or ``where`` itself when it is a file."""
    p = Path(where)
    return p if p.is_file() else p / LOG_FILE


def read_history(where: str | Path) -> RunHistory:
    """Read every readable line of the run log at ``where`` (a log directory or the ``metrics.jsonl`` file).

    A regular file only (a FIFO or device there is ``FileProblem``, never a hang); a line longer than
    ``MAX_LINE_BYTES`` is skipped and counted like any other unreadable line, so memory stays bounded."""
    path = log_file(where)
    try:
        fd = open_regular(path, follow=True)
    except FileMissing:
        raise RunLogMissing(f"no run log at {path}") from None
    history = RunHistory(path)
    with os.fdopen(fd, "rb") as fh:
        for raw in _bounded_lines(fh):
            if raw is None:
                history.skipped += 1
                continue
            if not raw.strip():
                continue
            try:
                item = decode(raw.decode("utf-8", "replace"))
            except RecordError:
                history.skipped += 1
                continue
            if isinstance(item, LoggedStep):
                history.steps.append(item)
            else:
                history.events.append(item)
    return history


def _bounded_lines(fh: BinaryIO) -> Iterator[bytes | None]:
    """The file's lines (split at "\\n" only); None for a line longer than ``MAX_LINE_BYTES`` (not kept)."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):  # skip the rest of the long line, a bounded piece at a time
                line = fh.readline(MAX_LINE_BYTES)
            yield None
            continue
        yield line
