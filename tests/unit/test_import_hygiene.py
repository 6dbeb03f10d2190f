"""The pure pieces import neither Ray nor torch (nor TransferQueue, tensordict): each is usable and testable alone.

Each module is imported in a fresh interpreter, so one module's imports cannot hide another's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.proc import REPO

PURE = [
    "sc_app.barrier",
    "sc_app.digest",
    "sc_app.config",
    "sc_app.durable_io",
    "sc_app.exits",
    "sc_app.faults",
    "sc_app.progress",
    "sc_app.phases",
    "sc_app.background",
    "sc_app.replay_buffer",
    "sc_app.checkpoint",  # the package: layout, manifest, verify, resume, retention, writer, quarantine
    "sc_app.checkpoint.compat",
    "sc_app.checkpoint.lease",
    "sc_app.checkpoint.contents",  # the parse half of verify: torch only once a bundle's contents are read
    "sc_app.checkpoint.policy_formats",
    "sc_app.safe_files",
    "sc_app.strict_json",
    "sc_app.data_plane.schema",
    "sc_app.policy.loader",
    "sc_app.policy.hf",  # the package, and what the driver checks before anything heavy starts:
    "sc_app.policy.hf.model_dir",
    "sc_app.policy.hf.dataset",
    "sc_app.policy.hf.rewards",
    "sc_app.data_plane.client",
    "sc_app.data_plane.retry",
    "sc_app.observe.goodput",
    "sc_app.policy.worker_restart",
    "sc_app.observe.records",
    "sc_app.observe.reader",
    "sc_app.observe.runlog",  # TensorBoard's writer (torch) is imported by the writer thread only
    "sc_app.observe.metrics",  # ray.util.metrics is imported when JobMetrics is built, once Ray is up
    "sc_app.observe.observer",
    "sc_app.observe.report",
]
HEAVY = ("ray", "torch", "transfer_queue", "tensordict")


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_nothing_heavy(module: str) -> None:
    code = (
        "import json, sys\n"
        f"import {module}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], f"{module} pulls in heavy modules"
