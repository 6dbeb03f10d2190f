"""The ``sc-app`` command line at its edge: bad input is one line and exit 2, before anything starts. ``main`` runs in
this process (the ``cli`` fixture); ``test_cli_smoke.py`` runs the real entry point once per command family."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from sc_app.observe.reader import read_history
from sc_app.observe.records import LOG_FILE, Event, Stamp, encode_event
from tests.support.bundles import make_bundle
from tests.support.cli import InProcess, Ran


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
def test_cli_bad_input_exits_2_with_one_line(cli: InProcess, args: list[str], needle: str) -> None:
    out = cli(*args)
    assert out.rc == 2, (out.rc, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("sc-app: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in out.stderr + out.stdout
    assert "starting fresh" not in out.stdout and "resuming" not in out.stdout, "refused before anything started"


def test_cli_malformed_config_file(cli: InProcess, tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("checkpoint: {save_period: 2\n")
    out = cli("run", "--config", str(f))
    assert out.rc == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "malformed YAML" in out.stderr


def test_cli_config_prints_resolved_yaml(cli: InProcess, tmp_path: Path) -> None:
    out = cli("config", "--set", "checkpoint.save_period=2", "--set", "trainer.resources={trainer_node: 1}")
    assert out.rc == 0, out.stderr
    doc = yaml.safe_load(out.stdout)
    assert doc["checkpoint"]["save_period"] == 2
    assert doc["trainer"]["resources"] == {"trainer_node": 1.0}


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--checkpoint-dir", "{file}"],
        ["preflight", "--checkpoint-dir", "{file}"],
        ["stop", "--checkpoint-dir", "{file}"],
        ["stop", "--checkpoint-dir", "{missing}"],
        ["ckpt", "list", "--checkpoint-dir", "{file}"],
        ["ckpt", "list", "--checkpoint-dir", "{missing}"],
        ["ckpt", "verify", "--checkpoint-dir", "{missing}"],
        ["ckpt", "prune", "--checkpoint-dir", "{file}", "--keep", "1"],
        ["ckpt", "prune", "--checkpoint-dir", "{missing}", "--keep", "1"],
    ],
)
def test_a_checkpoint_dir_that_cannot_be_used_is_one_line(cli: InProcess, tmp_path: Path, args: list[str]) -> None:
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    argv = [a.format(file=file, missing=tmp_path / "absent") for a in args]
    out = cli(*argv)
    assert out.rc == 2, (out.rc, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sc-app: error:"), out.stderr
    assert "Traceback" not in out.stderr + out.stdout
    assert file.read_text() == "x" and not (tmp_path / "absent").exists(), "nothing created or changed"


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_run_on_an_unwritable_volume_is_one_line_and_leaves_nothing(cli: InProcess, tmp_path: Path, kind: str) -> None:
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a read-only / full tmpfs needs root (the CI machine runs as root)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    options = "ro,size=1m" if kind == "read-only" else "size=64k"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
    try:
        if kind == "full":
            (mnt / "filler").write_bytes(b"\0" * (64 * 1024))
        before = sorted(p.name for p in mnt.iterdir())
        out = cli("run", "--checkpoint-dir", str(mnt))
        assert out.rc == 2, (out.stdout, out.stderr)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "cannot be written" in lines[0], out.stderr
        assert sorted(p.name for p in mnt.iterdir()) == before, "no lease, no probe, no partial file left"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# ---------------------------------------------------------------------------------------------- sc-app report
def one_error_line(out: Ran, needle: str) -> None:
    assert out.rc == 2, (out.rc, out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("sc-app: error:") and needle in lines[0], out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_report_bad_input_is_one_line(cli: InProcess, tmp_path: Path) -> None:
    one_error_line(cli("report", "--checkpoint-dir", str(tmp_path / "nope")), str(tmp_path / "nope/logs/metrics.jsonl"))
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x\n")
    one_error_line(cli("report", "--checkpoint-dir", str(a_file)), "no run log")
    one_error_line(cli("report", "--log-dir", str(a_file)), "holds no run-log record (1 unreadable lines)")
    one_error_line(cli("report"), "--checkpoint-dir")
    one_error_line(cli("report", "--checkpoint-dir", str(tmp_path), "--log-dir", str(tmp_path)), "not allowed with")

    logs = tmp_path / "ckpt" / "logs"
    logs.mkdir(parents=True)
    (logs / LOG_FILE).write_text(encode_event(Event("start", 0, {"decision": "fresh"}), Stamp(1.0, "r", 1)))
    one_error_line(cli("report", "--checkpoint-dir", str(tmp_path / "ckpt"), "--out", str(a_file)), "--out")
    ok = cli("report", "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert ok.rc == 0, ok.stderr
    assert (logs / "report" / "report.md").is_file() and (logs / "report" / "reward_loss.png").stat().st_size > 0


def test_a_refused_start_is_in_the_run_log_with_its_exit(cli: InProcess, tmp_path: Path) -> None:
    """A bundle this config cannot resume: exit 2 before Ray starts, and the run log says so."""
    make_bundle(tmp_path, 2)  # its recorded config is not the default one
    out = cli("run", "--checkpoint-dir", str(tmp_path))
    one_error_line(out, "incompatible")
    h = read_history(tmp_path / "logs")
    assert [e.name for e in h.events] == ["start", "exit"], "a refused run takes no lease"
    start, exit_ev = h.events
    assert start.data["decision"] == "refuse"
    assert exit_ev.data["code"] == 2 and "incompatible" in exit_ev.data["message"]
    assert f"run log: {tmp_path / 'logs' / LOG_FILE}" in out.stdout


def test_metrics_export_port_with_a_cluster_address_is_refused(cli: InProcess) -> None:
    out = cli("run", "--set", "ray.address=auto", "--set", "ray.metrics_export_port=9100")
    one_error_line(out, "ray.metrics_export_port")


@pytest.mark.parametrize(("args", "shown"), [(["--help"], "usage: sc-app"), (["--version"], "sc-app "),
                                             (["k8s", "wait", "--help"], "usage: sc-app k8s wait")])
def test_help_and_version_return_0_and_raise_nothing(cli: InProcess, args: list[str], shown: str) -> None:
    """argparse ends these with ``SystemExit``; ``main`` returns its code instead, so a caller's process goes on."""
    out = cli(*args)
    assert out.rc == 0 and out.stdout.startswith(shown) and out.stderr == "", out.out
