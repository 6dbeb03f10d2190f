"""What a start loads when: ``sc_app.attempt.run`` is light (no torch, tensordict or TransferQueue): refusals before
Ray starts never pay for them. (They are not loaded on a second thread while ``ray.init`` waits: two threads
importing torch's modules at once can deadlock inside the import system, which hands one of them a partially
initialised torch — seen when the run log's TensorBoard import raced such a thread.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.proc import REPO

HEAVY = ("torch", "tensordict", "transfer_queue", "transformers", "vllm")


@pytest.mark.parametrize("module", ["sc_app.attempt.run", "sc_app.attempt.errors", "sc_app.attempt.ray_start"])
def test_the_attempt_entry_imports_nothing_heavy(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) & set(HEAVY) == set()
