"""Seconds per test file, recorded from a real run (``tests/durations.json``), and the order they give the suite.

``make test`` hands whole files to the workers (``--dist loadfile``) in collection order: a long file handed out
last runs alone at the end. ``order`` puts the files longest first by the record (files it does not know yet last,
in their usual order). ``make test-durations`` runs the suite with ``--record-durations FILE``: ``Recorder`` sums
each file's setup, call and teardown seconds as the worker that ran it reported them (on the controller under
xdist) and ``merge`` writes them over the old record, so recording a few modules updates just those.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

FILE = Path(__file__).resolve().parents[1] / "durations.json"


def file_of(nodeid: str) -> str:
    """``tests/e2e/test_run.py::test_x[a]`` → ``tests/e2e/test_run.py``."""
    return nodeid.split("::", 1)[0]


def load(path: Path = FILE) -> dict[str, float]:
    """The record (test file → seconds); empty when there is none or it does not parse (ordering is a speed-up,
    never a reason to fail)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if isinstance(k, str) and isinstance(v, int | float)}


def order(
    items: Sequence[pytest.Item],
    seconds: Mapping[str, float],
    built_once: Collection[str] = (),
    workers: int = 2,
) -> list[pytest.Item]:
    """``items`` with the files the record knows first, longest first; the rest after them in their own order.
    Within a file the order is kept (the sort is stable and keyed by file only). No two of the ``workers`` files the
    workers start with need the same fixture of ``built_once`` (built by the first worker to ask while the others
    wait on its lock, ``tests/support/shared.py``): a starting file that would wait is swapped with the next file
    that needs none of what the files before it need."""

    def key(item: pytest.Item) -> tuple[int, float]:
        known = seconds.get(file_of(item.nodeid))
        return (0, -known) if known is not None else (1, 0.0)

    blocks: list[list[pytest.Item]] = []  # runs of one file's items, in the sorted order
    for item in sorted(items, key=key):
        if blocks and file_of(blocks[-1][0].nodeid) == file_of(item.nodeid):
            blocks[-1].append(item)
        else:
            blocks.append([item])

    def needs(block: list[pytest.Item]) -> set[str]:
        return {f for item in block for f in getattr(item, "fixturenames", ()) if f in built_once}

    taken: set[str] = set()  # what the starting files before position i build
    for i in range(min(workers, len(blocks))):
        if taken & needs(blocks[i]):
            free = next((j for j in range(i + 1, len(blocks)) if not taken & needs(blocks[j])), None)
            if free is not None:
                blocks[i], blocks[free] = blocks[free], blocks[i]
        taken |= needs(blocks[i])
    return [item for block in blocks for item in block]


def merge(old: Mapping[str, float], new: Mapping[str, float], root: Path) -> dict[str, float]:
    """The record after a run: ``new`` over ``old`` (rounded to 0.1 s), less the files no longer under ``root``."""
    merged = {**old, **{f: max(0.1, round(s, 1)) for f, s in new.items() if math.isfinite(s)}}
    return {f: merged[f] for f in sorted(merged) if (root / f).is_file()}


class Recorder:
    """The ``--record-durations`` plugin: per-file seconds from every test report, written at the session's end."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: Any) -> None:
        if not self.seconds:
            return
        record = merge(load(self.path), self.seconds, self.root)
        self.path.write_text(json.dumps(record, indent=1) + "\n")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"recorded the seconds of {len(self.seconds)} test files in {self.path}")
