"""``sc_app.cli.script``: Python's exit less the module teardown — threads joined, atexit run, output flushed, the
exit code kept (in a child interpreter: ``script`` ends its process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.proc import REPO

CHILD = """
import atexit, sys, threading, time
from pathlib import Path
import sc_app.cli as cli

out = Path(sys.argv[1])

def late_writer():
    time.sleep(0.5)
    (out / "thread").write_text("joined")

def main():
    threading.Thread(target=late_writer).start()  # not a daemon: the exit must wait for it
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    sys.stdout.write("unflushed line, no newline")
    return 3

cli.main = main
cli.script()
"""


def test_script_joins_threads_runs_atexit_flushes_and_keeps_the_code(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout == "unflushed line, no newline"
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
