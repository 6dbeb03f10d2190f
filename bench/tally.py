"""The verdict the stress scripts (``kill_stress.py``, ``chaos.py``) share: one line per iteration, then a JSON
summary and ``N passed, M failed``; exit 1 if any iteration found a problem."""

from __future__ import annotations

import json
import time


class Tally:
    def __init__(self, iterations: int) -> None:
        self.iterations = iterations
        self.failures = 0
        self.started = time.monotonic()

    def record(self, i: int, what: str, problems: list[str]) -> None:
        """Iteration ``i`` (from 0) did ``what`` and found ``problems`` (none: ok)."""
        self.failures += bool(problems)
        verdict = "ok" if not problems else "FAIL " + "; ".join(problems)
        print(f"[{i + 1:>3}/{self.iterations}] {what}: {verdict}", flush=True)

    def close(self) -> int:
        """Print the summary; the script's exit code."""
        seconds = round(time.monotonic() - self.started)
        print(json.dumps({"iterations": self.iterations, "failures": self.failures, "seconds": seconds}))
        print(f"{self.iterations - self.failures} passed, {self.failures} failed")
        return 1 if self.failures else 0
