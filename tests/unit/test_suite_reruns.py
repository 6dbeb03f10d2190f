"""The suite's one rerun rule (pyproject: ``reruns``, ``only_rerun``): a test that failed because Ray could not start
in time — ``RayDidNotStart`` from the run helpers, or Ray's own line from a ``Cluster`` or the local Ray — runs once
more; any other failure fails at once. Checked with the repository's own pytest configuration on a throwaway
test file, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import REPO, RayDidNotStart, ray_did_not_start

CASES = '''
from pathlib import Path

import pytest

from tests.support.proc import RayDidNotStart

HERE = Path(__file__).parent


def once(name: str) -> bool:
    """True the first time ``name`` is asked in this directory."""
    marker = HERE / f"{name}.seen"
    first = not marker.exists()
    marker.touch()
    return first


def test_our_helpers_line():
    if once("helpers"):
        raise RayDidNotStart("sc-app: error: Ray timed out starting its embedded node twice (...)")


def test_rays_own_line():
    if once("ray"):
        raise Exception("The current node timed out during startup. This could happen because ...")


@pytest.fixture(scope="module")
def runs():
    """A module's runs (tests/e2e/test_vllm_run.py): built again by the rerun, not the failure replayed."""
    if once("fixture"):
        raise RayDidNotStart("sc-app: error: Ray timed out starting its embedded node twice (...)")
    return "built"


def test_a_module_fixtures_runs(runs):
    assert runs == "built"


def test_any_other_failure():
    once("other")
    assert False, "a real failure"
'''


def test_only_a_ray_start_timeout_is_run_again(tmp_path: Path) -> None:
    (tmp_path / "test_cases.py").write_text(CASES)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            str(tmp_path / "test_cases.py"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and "1 failed, 3 passed" in summary and "3 rerun" in summary, proc.stdout[-3000:]
    assert "FAILED test_cases.py::test_any_other_failure" in proc.stdout


def test_a_runs_output_with_rays_line_is_ray_did_not_start() -> None:
    ray_did_not_start("sc-app 0.1.0: ...\nresuming from step_2\n")  # anything else: nothing raised
    line = (
        'sc-app: error: Ray timed out starting its embedded node twice ("The current node timed out during '
        'startup. This could happen because ..."): the node is too loaded'
    )
    with pytest.raises(RayDidNotStart) as raised:
        ray_did_not_start(f"sc-app 0.1.0: ...\n{line}\ngoodput 0.0%\n")
    assert str(raised.value) == line
