"""The background uploader's decisions, with the upload itself replaced (its real behaviour is
``tests/integration/checkpoint/test_remote_s3.py``'s): a failure is retried with backoff, a newer bundle supersedes
an older one not yet uploaded, a bundle local retention removed meanwhile is not retried, a lost bucket ends the
uploads, ``drain`` is bounded."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint.remote import uploader as mod
from sc_app.checkpoint.remote.fence import RemoteLease, RemoteLeaseLost
from sc_app.checkpoint.remote.store import RemoteError
from sc_app.checkpoint.remote.upload import UploadResult

LEASE = RemoteLease("r", 1, "lin")


def bundle(root: Path, step: int) -> Path:
    (root / f"step_{step}").mkdir(exist_ok=True)
    return root / f"step_{step}"


def make(monkeypatch: pytest.MonkeyPatch, behave: Any) -> tuple[mod.Uploader, list[str]]:
    calls: list[str] = []

    def fake(store: Any, bundle: Path, lease: RemoteLease, **_: Any) -> UploadResult:
        calls.append(bundle.name)
        behave(bundle, len(calls))
        return UploadResult(int(bundle.name.split("_")[1]), bundle.name, 1, 0.0, True)

    monkeypatch.setattr(mod, "upload_bundle", fake)
    return mod.Uploader(None, LEASE, hmac_key=None, deadline_s=5, backoff_s=(0.05, 0.2)), calls  # type: ignore[arg-type]


def test_a_failed_upload_is_retried_until_it_publishes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def flaky(bundle: Path, n: int) -> None:
        if n < 3:
            raise RemoteError("s3://b/k: connection refused")

    up, calls = make(monkeypatch, flaky)
    up.submit(bundle(tmp_path, 2))
    assert up.drain(10)
    assert calls == ["step_2"] * 3 and [r.step for r in up.results] == [2] and up.failures == 2
    up.stop()


def test_a_newer_bundle_supersedes_one_waiting_for_its_retry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gate = threading.Event()

    def step2_fails(bundle: Path, n: int) -> None:
        if bundle.name == "step_2":
            gate.set()
            raise RemoteError("s3://b/k: 500")

    up, calls = make(monkeypatch, step2_fails)
    up.submit(bundle(tmp_path, 2))
    assert gate.wait(5)
    up.submit(bundle(tmp_path, 4))
    assert up.drain(10)
    assert calls[-1] == "step_4" and [r.step for r in up.results] == [4]
    up.stop()


def test_a_lost_bucket_ends_the_uploads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def lost(bundle: Path, n: int) -> None:
        raise RemoteLeaseLost("s3://b/LEASE is now held by run other (epoch 2)")

    up, calls = make(monkeypatch, lost)
    up.submit(bundle(tmp_path, 2))
    assert not up.drain(5) and up.lost is not None and "epoch 2" in up.lost
    up.submit(bundle(tmp_path, 4))
    time.sleep(0.2)
    assert calls == ["step_2"], "nothing more is uploaded"
    up.stop()


def test_drain_is_bounded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    release = threading.Event()
    up, _ = make(monkeypatch, lambda b, n: release.wait(10))
    up.submit(bundle(tmp_path, 2))
    t0 = time.monotonic()
    assert not up.drain(0.3) and time.monotonic() - t0 < 3
    release.set()
    assert up.drain(10)
    up.stop()


def test_a_bundle_removed_locally_meanwhile_is_not_retried(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gone = bundle(tmp_path, 2)

    def vanished(b: Path, n: int) -> None:
        b.rmdir()
        raise FileNotFoundError(f"{b}/manifest.json")

    up, calls = make(monkeypatch, vanished)
    up.submit(gone)
    assert up.drain(5) and calls == ["step_2"] and up.results == []
    up.stop()
