"""The ``sc-app`` command line at its edge: bad input is one line and exit 2, before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.proc import REPO


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sc_app", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--set", "nope=1"], "'nope'"),
        (["run", "--set", "checkpoint.save_period=abc"], "checkpoint.save_period"),
        (["run", "--set", "data_plane.storage_units=20"], "data_plane.storage_units"),
        (["run", "--bogus-flag"], "--bogus-flag"),
        (["run", "--max-steps", "many"], "--max-steps"),
        (["run", "--config", "/nonexistent/job.yaml"], "/nonexistent/job.yaml"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args: list[str], needle: str) -> None:
    out = cli(*args)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("sc-app: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert "starting fresh" not in out.stdout and "resuming" not in out.stdout, "refused before anything started"


def test_cli_malformed_config_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("checkpoint: {save_period: 2\n")
    out = cli("run", "--config", str(f))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "malformed YAML" in out.stderr


def test_cli_config_prints_resolved_yaml(tmp_path: Path) -> None:
    out = cli("config", "--set", "checkpoint.save_period=2", "--set", "trainer.resources={trainer_node: 1}")
    assert out.returncode == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert doc["checkpoint"]["save_period"] == 2
    assert doc["trainer"]["resources"] == {"trainer_node": 1.0}
