"""Issue 31 G, end to end: ``sc-app run`` with ``RAY_TMPDIR`` pointing nowhere (missing, a file, unwritable) ends
with one line naming the variable, a non-zero exit and no traceback (the retry of a start-up timeout is unit-tested
in ``tests/unit/attempt/test_ray_start.py``: a loaded node cannot be made on demand)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("case", ["missing", "a-file", "unwritable"])
def test_run_with_an_unusable_ray_tmpdir_is_one_line(tmp_path: Path, case: str) -> None:
    (tmp_path / "file").write_text("x")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    unwritable = ro if os.geteuid() != 0 else Path("/proc")  # root ignores modes; /proc takes no directory
    target = {"missing": tmp_path / "nope", "a-file": tmp_path / "file", "unwritable": unwritable}[case]
    out = subprocess.run(
        [sys.executable, "-m", "sc_app", "run", "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-steps", "2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_TMPDIR": str(target)},
    )
    assert out.returncode != 0, out.stdout[-2000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sc-app: error:") and f"RAY_TMPDIR={target}" in lines[0], out.stderr
    assert "Traceback" not in out.stdout + out.stderr
