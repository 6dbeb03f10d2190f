"""``sc-app run`` refuses a bucket it cannot use with one line and exit 2, before anything is taken or started
(no lease, no Ray): wrong credentials, none at all, a missing bucket, credentials that may only read. Against the
suite's real S3 server (``tests/support/rgw.py``); the server that ignores conditional writes is
``tests/unit/checkpoint/test_remote_probe.py``'s (RGW honours them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import InProcess
from tests.support.rgw import RO_ACCESS_KEY, RO_SECRET_KEY


def remote_sets(cfg: Any, **change: str) -> list[str]:
    values = {k: getattr(cfg, k) for k in ("url", "endpoint", "region", "addressing_style")} | change
    return [a for k, v in values.items() for a in ("--set", f"checkpoint.remote.{k}={v}")]


@pytest.mark.parametrize(
    ("why", "env", "change", "needle"),
    [
        ("wrong secret", {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, {}, "SignatureDoesNotMatch"),
        ("unknown key", {"AWS_ACCESS_KEY_ID": "NOSUCHACCESSKEY00000"}, {}, "InvalidAccessKeyId"),
        ("read-only", {"AWS_ACCESS_KEY_ID": RO_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": RO_SECRET_KEY}, {}, "AccessDenied"),
        ("no bucket", {}, {"url": "s3://no-such-bucket-sc/p"}, "NoSuchBucket"),
    ],
)
def test_a_bucket_that_cannot_be_used_is_refused_before_anything_starts(
    cli: InProcess, s3_remote: Any, tmp_path: Path, why: str, env: dict[str, str], change: dict[str, str], needle: str
) -> None:
    ckpt = tmp_path / "ckpt"
    out = cli("run", "--checkpoint-dir", str(ckpt), *remote_sets(s3_remote, **change), env=env)
    assert out.rc == 2, (why, out.out)
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and needle in errors[0] and "checkpoint.remote.url=" in errors[0], (why, out.stderr)
    assert "Traceback" not in out.out and "starting fresh" not in out.stdout
    assert "not-the-secret" not in out.out and RO_SECRET_KEY not in out.out  # never a credential in a line
    assert not (ckpt / "LEASE").exists(), "refused before the lease was taken"


def test_no_credentials_at_all_is_one_line(cli: InProcess, s3_remote: Any, tmp_path: Path) -> None:
    env = {
        "AWS_ACCESS_KEY_ID": "",
        "AWS_SECRET_ACCESS_KEY": "",
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    out = cli("run", "--checkpoint-dir", str(tmp_path / "ckpt"), *remote_sets(s3_remote), env=env)
    assert out.rc == 2, out.out
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "NoCredentialsError" in errors[0], out.stderr
