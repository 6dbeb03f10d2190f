"""The real entry point, once per command family: ``python -m sc_app`` (and the ``sc-app`` script, for ``config``)
in a process of its own, refusing bad input with exactly one ``<prog>: error:`` line on stderr, the exit code of
``sc_app.exits`` and no traceback. Every other refusal test calls ``main(argv)`` in-process (``tests.support.cli``),
which is only as good as this proof that the process around ``main`` exits with what it returns and prints nothing
more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import REPO

SCRIPT = Path(sys.executable).parent / "sc-app"
CASES = {  # family: (argv with {file}/{missing} filled in, what the one line names)
    "run": (["run", "--set", "nope=1"], "unknown config key 'nope'"),
    "preflight": (["preflight", "--checkpoint-dir", "{file}"], "{file}"),
    "stop": (["stop", "--checkpoint-dir", "{missing}", "--wait", "nan"], "--wait nan"),
    "ckpt": (["ckpt", "verify", "--checkpoint-dir", "{missing}"], "{missing} does not exist"),
    "export": (["export", "--checkpoint-dir", "{missing}", "--out", "{missing}/out"], "{missing} does not exist"),
    "report": (["report", "--log-dir", "{file}"], "holds no run-log record"),
    "config": (["config", "--set", "grpo.temperature=.nan"], "grpo.temperature"),
    "k8s": (["k8s", "wait", "demo", "--timeout", "nan"], "argument --timeout: 'nan'"),
}


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_refusal_through_the_real_entry_point_is_one_line(tmp_path: Path, family: str) -> None:
    file, missing = tmp_path / "a-file", tmp_path / "absent"
    file.write_text("x\n")
    args, named = CASES[family]
    argv = [a.format(file=file, missing=missing) for a in args]
    entry = [str(SCRIPT)] if family == "config" and SCRIPT.exists() else [sys.executable, "-m", "sc_app"]
    done = subprocess.run([*entry, *argv], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("sc-app: error: "), done.stderr
    assert named.format(file=file, missing=missing) in lines[0], lines[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not missing.exists() and file.read_text() == "x\n", "a refusal creates and changes nothing"

