"""Runbook commands that need no cluster are marked ``# local-ok`` in ops/RUNBOOKS.md; test_manifest_e2e.py runs
them against the bundles of its local end to end."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from k8s_helpers import REPO_ROOT

RUNBOOK = REPO_ROOT / "ops" / "RUNBOOKS.md"


def local_commands() -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^(.*?)#\s*local-ok\s*$", RUNBOOK.read_text(), re.M)]


def test_runbook_has_local_commands() -> None:
    cmds = local_commands()
    assert len(cmds) >= 4, cmds
    assert any(c.startswith("sc-app k8s submit") for c in cmds)
    assert any(c.startswith("sc-app preflight") for c in cmds)


def run_local_commands(ckpt: Path) -> list[str]:
    """Run every ``# local-ok`` runbook line with CKPT=ckpt; returns their outputs. Used by the local end to end
    (test_manifest_e2e.py), which has real bundles for ``ckpt verify``/``preflight`` to look at."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "NS": "ml",
        "RELEASE": "grpo",
        "JOB": "grpo-sc-app",
        "CKPT": str(ckpt),
    }
    outputs = []
    for cmd in local_commands():
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
        outputs.append(proc.stdout)
    return outputs
