"""``WarmReset``'s start of the new data plane is bounded by ``run.reset_timeout_s``: TransferQueue's start waits
within that bound (``sc_app.waits``) and a hang there is ``ResetFailed`` — the fallback to the full rebuild — not a
restore that waits for ever. The data-plane client is a fake that records the bound it ran under."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sc_app.attempt import warm_reset
from sc_app.attempt.in_job_restore import ResetFailed
from sc_app.config.app import AppConfig
from sc_app.waits import ProcessHung, current


def test_a_data_plane_start_that_hangs_is_a_failed_reset_within_reset_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    bounds: list[Any] = []

    def hung_start(cfg: AppConfig) -> None:
        bounds.append(current())
        raise ProcessHung("data_plane.storage", "TransferQueue's storage unit(s) #1 on node b", 12.0, current().why)

    monkeypatch.setattr(warm_reset, "bootstrap_data_plane", hung_start)
    who = warm_reset.JobIdentity("run", None, None, None)
    reset = warm_reset.WarmReset(AppConfig(), who, epoch=2, timeout_s=12.0)
    began = time.monotonic()
    with pytest.raises(ResetFailed) as raised:
        reset._start_data_plane()
    assert "storage unit(s) #1 on node b" in str(raised.value) and "run.reset_timeout_s=12s" in str(raised.value)
    (bound,) = bounds
    assert bound.until is not None and 11.0 <= bound.until - began <= 12.5
