"""Issue 22 through the CLI's ``main`` in this process (the ``cli`` fixture; no Ray: everything here is refused before
Ray would start): every command against special files where it expects records, every numeric config key with
non-finite or absurd values, the HMAC key, ``export --out`` and ``report`` on hostile logs. Each case asserts the
exit code, exactly one ``sc-app: error:`` line naming the problem, no traceback, no hang (each test is bounded by
``TIMEOUT``: pytest-timeout interrupts a blocked read) and nothing lost (the bundle that was there still verifies, no
bogus bundle appears). The real entry point is proven once per command in ``test_cli_smoke.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.lease import LEASE_FILE, LOCK_FILE
from sc_app.checkpoint.lineage import LINEAGE_FILE
from sc_app.observe.records import LOG_FILE
from tests.support.bundles import make_bundle
from tests.support.cli import InProcess, Ran
from tests.support.cli import refused as one_line

TIMEOUT = 90
pytestmark = pytest.mark.timeout(TIMEOUT)  # a read blocked on a FIFO fails the test instead of hanging the suite


def refused(result: Ran, code: int, *named: str) -> str:
    line = one_line(result, code, *named)
    assert len(line) < 1000, line
    return line


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    root = tmp_path / "ck"
    make_bundle(root, 2)
    return root


def still_verifies(root: Path) -> None:
    assert [p.name for p in sorted(root.glob("step_*"))] == ["step_2"]
    assert verify_bundle(root / "step_2").ok


def plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()


COMMANDS = {
    "run": ["run", "--max-steps", "4"],
    "stop": ["stop", "--wait", "1"],
    "preflight": ["preflight"],
    "preflight --dry-run": ["preflight", "--dry-run"],
    "ckpt prune": ["ckpt", "prune", "--keep", "1"],
    "ckpt list": ["ckpt", "list"],
    "ckpt verify": ["ckpt", "verify"],
}


READS = [  # (command, the record it reads): LEASE by the writers and the lease-aware tools, LINEAGE by all but stop
    *((c, LEASE_FILE) for c in ("run", "stop", "preflight", "ckpt prune")),
    *((c, LINEAGE_FILE) for c in sorted(COMMANDS) if c != "stop"),
]


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
@pytest.mark.parametrize(("command", "record"), READS, ids=[f"{c}-{r}" for c, r in READS])
def test_special_files_as_records_are_one_line(
    cli: InProcess, ckpt: Path, command: str, record: str, kind: str
) -> None:
    plant(ckpt / record, kind)
    result = cli(*COMMANDS[command], "--checkpoint-dir", str(ckpt))
    refused(result, 2, record)
    still_verifies(ckpt)


@pytest.mark.parametrize("command", ["preflight", "ckpt prune"])
@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_a_lock_file_that_is_not_a_file_is_one_line(cli: InProcess, ckpt: Path, command: str, kind: str) -> None:
    plant(ckpt / LOCK_FILE, kind)
    refused(cli(*COMMANDS[command], "--checkpoint-dir", str(ckpt)), 2, LOCK_FILE)
    still_verifies(ckpt)


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
@pytest.mark.parametrize("command", ["config", "run"])
def test_a_config_file_that_is_not_a_file_is_one_line(cli: InProcess, tmp_path: Path, command: str, kind: str) -> None:
    plant(tmp_path / "job.yaml", kind)
    extra = ["--checkpoint-dir", str(tmp_path / "ck")] if command == "run" else []
    refused(cli(command, "--config", str(tmp_path / "job.yaml"), *extra), 2, "job.yaml")


NUMBERS = [
    ("checkpoint.lease_ttl_s=.inf", "checkpoint.lease_ttl_s"),
    ("checkpoint.lease_ttl_s=1.0e300", "checkpoint.lease_ttl_s"),
    ("checkpoint.emergency_budget_s=.inf", "checkpoint.emergency_budget_s"),
    ("checkpoint.emergency_budget_s=.nan", "checkpoint.emergency_budget_s"),
    ("grpo.learning_rate=.inf", "grpo.learning_rate"),
    ("grpo.temperature=.nan", "grpo.temperature"),
    ("trainer.num_cpus=1.0e300", "trainer.num_cpus"),
    ("generation.num_gpus=.inf", "generation.num_gpus"),
    ("trainer.resources={x: .inf}", "trainer.resources"),
    ("run.seed=" + "9" * 30, "run.seed"),
    ("run.max_steps=" + "9" * 5000, "run.max_steps"),
    ("checkpoint.save_period=" + "[" * 5000, "checkpoint.save_period"),
    ("task.prompt_len=99999999999", "task.prompt_len"),
    ("model.max_seq_len=4294967296", "model.max_seq_len"),
    ("run.log_buffer=999999999999", "run.log_buffer"),
    ("grpo.group_size=9999999", "grpo.group_size"),
]


@pytest.mark.parametrize(("override", "key"), NUMBERS, ids=[k for _, k in NUMBERS])
def test_every_number_is_finite_and_bounded(cli: InProcess, tmp_path: Path, override: str, key: str) -> None:
    refused(cli("config", "--set", override), 2, key)


def test_a_nul_in_a_configured_path_is_one_line(cli: InProcess, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text('checkpoint:\n  dir: "ck\\0pt"\n')
    refused(cli("config", "--config", str(tmp_path / "job.yaml")), 2, "checkpoint.dir", "NUL")


def test_a_checkpoint_path_too_long_for_its_bundles_is_refused_at_start(cli: InProcess, tmp_path: Path) -> None:
    deep = tmp_path
    while len(str(deep)) < 3800:
        deep = deep / ("d" * 200)
    line = refused(cli("run", "--checkpoint-dir", str(deep)), 2, "path limit")
    assert "space" not in line
    assert not deep.exists()


@pytest.mark.parametrize(("value", "named"), [("", "set but empty"), ("\udcff\udcfe", "not UTF-8")])
@pytest.mark.parametrize("command", ["ckpt verify", "preflight", "run"])
def test_an_hmac_key_set_but_unusable_is_an_error_not_signing_off(
    cli: InProcess, ckpt: Path, command: str, value: str, named: str
) -> None:
    result = cli(
        *COMMANDS[command], "--checkpoint-dir", str(ckpt), env={"SC_APP_CHECKPOINT_HMAC_KEY": value}
    )
    refused(result, 2, "SC_APP_CHECKPOINT_HMAC_KEY", named)
    still_verifies(ckpt)
    assert not (ckpt / LEASE_FILE).exists()


@pytest.mark.parametrize(("env", "named"), [
    ({"SC_APP_CHECKPOINT_HMAC_KEY_FILE": "/nonexistent/hmac"}, "does not exist; mount the key Secret there"),
    ({"SC_APP_CHECKPOINT_HMAC_KEY_FILE": "/dev/null"}, "holds no key"),
    ({"SC_APP_CHECKPOINT_HMAC_KEY_FILE": "/dev/null", "SC_APP_CHECKPOINT_HMAC_KEY": "k"}, "both"),
], ids=["missing", "empty", "both"])  # fmt: skip
@pytest.mark.parametrize("command", ["ckpt verify", "preflight", "run"])
def test_an_hmac_key_file_that_is_unusable_is_an_error_not_signing_off(
    cli: InProcess, ckpt: Path, command: str, env: dict[str, str], named: str
) -> None:
    result = cli(*COMMANDS[command], "--checkpoint-dir", str(ckpt), env=env)
    refused(result, 2, "SC_APP_CHECKPOINT_HMAC_KEY_FILE", named)
    still_verifies(ckpt)
    assert not (ckpt / LEASE_FILE).exists()


OUTS = {
    "inside a bundle": ("{ck}/step_2/policy/x", "inside the checkpoint directory"),
    "a bogus newest bundle": ("{ck}/step_99", "inside the checkpoint directory"),
    "the checkpoint dir": ("{ck}", "inside the checkpoint directory"),
    "through a link into it": ("{tmp}/link/step_7", "inside the checkpoint directory"),
    "a symlink": ("{tmp}/alias", "symbolic link"),
    "dot": (".", "names no new directory"),
    "dot-dot": ("{tmp}/..", "names no new directory"),
    "a name too long": ("{tmp}/" + "n" * 250, "keep it under"),
    "a path too long": ("{tmp}/" + "/".join(["p" * 200] * 20), "choose a shorter path"),
}


@pytest.mark.parametrize("case", sorted(OUTS))
def test_export_out_is_checked_before_anything_is_written(
    cli: InProcess, ckpt: Path, tmp_path: Path, case: str
) -> None:
    (tmp_path / "link").symlink_to(ckpt)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "elsewhere")
    out, named = OUTS[case]
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    result = cli(
        "export", "--checkpoint-dir", str(ckpt), "--out", out.format(ck=ckpt, tmp=tmp_path)
    )
    refused(result, 2, "--out", named)
    still_verifies(ckpt)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before


def step_line(step: object, **extra: object) -> str:
    rec = {
        "v": 1,
        "kind": "step",
        "t": 1.0,
        "run_id": "r",
        "attempt": 1,
        "step": step,
        "reward_mean": 0.5,
        "reward_min": 0.0,
        "reward_max": 1.0,
        "loss": 0.1,
        "staleness": 0.0,
        "rows_held": 1,
        "step_seconds": 0.1,
        "weights_version": 1,
    }
    return json.dumps({**rec, **extra}) + "\n"


REPORTS = {
    "step 10**12": step_line(1) + step_line(10**12),
    "non-numeric event fields": step_line(1)
    + json.dumps(
        {
            "v": 1,
            "kind": "event",
            "t": 2.0,
            "run_id": "r",
            "attempt": 1,
            "event": "dropped",
            "step": 1,
            "steps": "many",
            "events": [1],
            "write_failed": {"a": 1},
        }
    )
    + "\n"
    + json.dumps(
        {
            "v": 1,
            "kind": "event",
            "t": 3.0,
            "run_id": "r",
            "attempt": 1,
            "event": "save",
            "step": 1,
            "seconds": "slow",
            "bytes": None,
        }
    )
    + "\n",
    "a step of 5000 digits": step_line(1) + step_line(1).replace('"step": 1', '"step": ' + "9" * 5000),
    "a line nested 100000 deep": step_line(1) + "[" * 100_000 + "\n",
    "non-numeric step fields": step_line(1) + step_line("two", loss="low"),
}


@pytest.mark.parametrize("case", sorted(REPORTS))
def test_report_on_a_hostile_run_log_ends(cli: InProcess, tmp_path: Path, case: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / LOG_FILE).write_text(REPORTS[case])
    result = cli("report", "--log-dir", str(logs), "--json")
    assert result.rc == 0 and "Traceback" not in result.out, result.out[-3000:]
    summary = json.loads(result.stdout[result.stdout.index("{") :])
    assert summary["first_step"] == 1 and len(summary["missing_steps"]) <= 1000
    if case == "step 10**12":
        assert summary["last_step"] == 10**12 and summary["missing_count"] == 10**12 - 2


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_report_on_a_log_that_is_not_a_file_is_one_line(cli: InProcess, tmp_path: Path, kind: str) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    plant(logs / LOG_FILE, kind)
    refused(cli("report", "--log-dir", str(logs)), 2, LOG_FILE)


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_a_trace_file_that_is_not_a_file_is_refused_before_ray(cli: InProcess, tmp_path: Path, kind: str) -> None:
    plant(tmp_path / "trace", kind)
    ck = tmp_path / "ck"
    result = cli(
        "run", "--checkpoint-dir", str(ck), "--set", f"run.trace_file={tmp_path / 'trace'}"
    )
    refused(result, 2, "run.trace_file")
    assert not (ck / LEASE_FILE).exists()


@pytest.mark.parametrize("wait", ["nan", "inf", "-1", "1e300"])
def test_stop_wait_must_be_a_sane_number_of_seconds(cli: InProcess, ckpt: Path, wait: str) -> None:
    refused(cli("stop", "--checkpoint-dir", str(ckpt), "--wait", wait), 2, "--wait")


LAUGHS = "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
    for p, n in zip(["", "a", "b", "c", "d", "e", "f", "g"], ["a", "b", "c", "d", "e", "f", "g", "h"], strict=True)
)


@pytest.mark.parametrize("how", ["--config", "--set"])
def test_yaml_aliases_that_expand_to_billions_are_one_line(cli: InProcess, tmp_path: Path, how: str) -> None:
    if how == "--config":
        (tmp_path / "job.yaml").write_text(LAUGHS + "run: {seed: *h}\n")
        args = ["--config", str(tmp_path / "job.yaml")]
    else:
        flow = (
            "[&a [lol, lol, lol, lol, lol, lol, lol, lol, lol], "
            + ", ".join(f"&{n} [{', '.join([f'*{p}'] * 9)}]" for p, n in zip("abcdef", "bcdefg", strict=True))
            + ", ["
            + ", ".join(["*g"] * 9)
            + "]]"
        )
        args = ["--set", f"run.seed={flow}"]
    refused(cli("config", *args), 2, "expands to more than")
