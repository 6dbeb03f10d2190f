"""What a start loads when: ``sc_app.attempt.run`` is light (no torch, tensordict or TransferQueue), so the set-up's
heavy imports load on another thread while ``ray.init`` waits on Ray's processes (``ray_start.import_in_background``)
— and refusals before Ray starts never pay for them."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys

import pytest

from sc_app.attempt import ray_start
from sc_app.attempt.run import SETUP_MODULES
from tests.support.proc import REPO

HEAVY = ("torch", "tensordict", "transfer_queue", "transformers", "vllm")


@pytest.mark.parametrize("module", ["sc_app.attempt.run", "sc_app.attempt.errors", "sc_app.attempt.ray_start"])
def test_the_attempt_entry_imports_nothing_heavy(module: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) & set(HEAVY) == set()


def test_the_background_import_loads_what_setup_needs_and_no_module_of_ray() -> None:
    """No Ray module is left for the background thread to import: it never imports one of Ray's modules at the same
    time as ``ray.init`` (which imports some of its own lazily) on the main thread."""
    assert "sc_app.attempt.setup" in SETUP_MODULES
    for name in SETUP_MODULES:  # each exists: a typo would only show as a slower start
        assert importlib.util.find_spec(name) is not None, name
    code = (
        "import json, sys, sc_app.cli, sc_app.attempt.run, sc_app.observe.observer\n"
        "before = {m for m in sys.modules if m.split('.')[0] == 'ray'}\n"
        f"for m in {list(SETUP_MODULES)!r}: __import__(m)\n"
        "print(json.dumps(sorted({m for m in sys.modules if m.split('.')[0] == 'ray'} - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_a_background_import_that_fails_fails_again_where_it_is_needed() -> None:
    thread = ray_start.import_in_background("json", "sc_app_no_such_module_for_this_test")
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "json" in sys.modules
    with pytest.raises(ModuleNotFoundError, match="sc_app_no_such_module_for_this_test"):
        importlib.import_module("sc_app_no_such_module_for_this_test")
