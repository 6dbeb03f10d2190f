"""Read a run log back across attempts. Pure apart from reading the file.

The effective series has one record per step: where several attempts logged a step (a resume from an older
bundle trained it again, or a superseded attempt was still dying), the newest attempt's record counts — the same
record the writer did not mark as ``redone``. Lines that cannot be read (a line torn by a SIGKILL, a newer schema)
are skipped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sc_app.observe.records import (
    LOG_FILE,
    SAVE_EVENTS,
    LoggedEvent,
    LoggedStep,
    RecordError,
    decode,
)


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

    def missing_steps(self) -> list[int]:
        """Steps between 1 and the last one logged that no attempt logged (e.g. dropped on a slow volume)."""
        have = {s.step for s in self.steps}
        return [n for n in range(1, max(have, default=0) + 1) if n not in have]

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
    """Read every readable line of the run log at ``where`` (a log directory or the ``metrics.jsonl`` file)."""
    path = log_file(where)
    try:
        fh = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
    except (FileNotFoundError, NotADirectoryError):
        raise RunLogMissing(f"no run log at {path}") from None
    history = RunHistory(path)
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                item = decode(line)
            except RecordError:
                history.skipped += 1
                continue
            if isinstance(item, LoggedStep):
                history.steps.append(item)
            else:
                history.events.append(item)
    return history
