"""The pure pieces import neither Ray nor torch (nor TransferQueue, tensordict): each is usable and testable alone.

Each module is imported in a fresh interpreter, so one module's imports cannot hide another's.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from tests.support.proc import REPO

PURE = [
    "sc_app.data_plane.barrier",
    "sc_app.config.tree",
    "sc_app.config.input",
    "sc_app.data_plane.replay_index",
    "sc_app.io.digest",
    "sc_app.config.app",
    "sc_app.config.engine",
    "sc_app.io.durable",
    "sc_app.exits",
    "sc_app.faults",
    "sc_app.progress",
    "sc_app.phases",
    "sc_app.waits",  # bounded waits: Ray only when no wait/fetch is given
    "sc_app.attempt.cluster_fit",
    "sc_app.attempt.in_job_restore",
    "sc_app.attempt.restore_policy",
    "sc_app.attempt.restore_scope",
    "sc_app.io.background",
    "sc_app.data_plane.replay_buffer",
    "sc_app.checkpoint",  # the package: layout, manifest, verify, resume, retention, writer, quarantine
    "sc_app.checkpoint.compat",
    "sc_app.checkpoint.dataset",
    "sc_app.checkpoint.selection",
    "sc_app.checkpoint.lease",
    "sc_app.checkpoint.contents",  # the parse half of verify: torch only once a bundle's contents are read
    "sc_app.checkpoint.policy_formats",
    "sc_app.io.safe_files",
    "sc_app.io.strict_json",
    "sc_app.data_plane.schema",
    "sc_app.rl.loader",
    "sc_app.rl.export_target",  # where export --out may write: checked by the CLI before anything heavy
    "sc_app.rl.hooks",  # what the generic path asks a backend or task: imported only on use
    "sc_app.cli",  # the parser of every command: the commands import what they need when they run
    "sc_app.rl.hf",  # the package, and what the driver checks before anything heavy starts:
    "sc_app.rl.hf.model_dir",
    "sc_app.rl.hf.dataset",
    "sc_app.rl.hf.rewards",
    "sc_app.data_plane.client",
    "sc_app.data_plane.retry",
    "sc_app.observe.goodput",
    "sc_app.rl.worker_restart",
    "sc_app.rl.weight_sync",  # the seam: push (Ray on use), the transport interface and its one choice
    "sc_app.rl.weight_sync.push",
    "sc_app.rl.weight_sync.factory",
    "sc_app.rl.weight_sync.object_store",
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


# The generic path reaches a backend or a task only through ``sc_app.rl.hooks``: a third backend adds a module
# and a line there, never an edit here.
CLI = sorted(str(p.relative_to(REPO)) for p in (REPO / "sc_app" / "cli").glob("*.py"))
GENERIC = ["sc_app/attempt/run.py", "sc_app/attempt/setup.py", *CLI]
BACKENDS = ("sc_app.rl.hf", "sc_app.rl.tiny_backend")


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` statement of ``source`` names, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_scan_sees_every_kind_of_import() -> None:
    source = "import a.b\ndef f():\n    from sc_app.rl import hf\n    from sc_app.rl.hf.errors import E\n"
    assert {"a.b", "sc_app.rl.hf", "sc_app.rl.hf.errors"} <= imported_modules(source)
    assert len(CLI) > 5, "the cli package"


@pytest.mark.parametrize("path", GENERIC)
def test_the_generic_path_imports_no_backend(path: str) -> None:
    named = sorted(m for m in imported_modules((REPO / path).read_text()) if m.startswith(BACKENDS))
    assert named == [], f"{path} imports a backend's module; ask sc_app.rl.hooks instead"


def test_loading_the_generic_path_loads_no_backend() -> None:
    code = (
        "import json, sys\n"
        "import sc_app.attempt.run, sc_app.attempt.setup, sc_app.cli\n"
        "sc_app.cli.build_parser()\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sc_app.rl.hf'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
