"""faults: the injection points are inert unless named, and each action does exactly what it says."""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sc_app import faults
from tests.support.proc import REPO


@pytest.fixture(autouse=True)
def _fresh_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.setattr(faults, "_fired", {})
    for var in (
        "SC_APP_FAULT_AT",
        "SC_APP_FAULT_ACTION",
        "SC_APP_FAULT_AFTER",
        "SC_APP_FAULT_DELAY_S",
        "SC_APP_FAULT_EVERY",
        "SC_APP_FAULT_TIMES",
    ):
        monkeypatch.delenv(var, raising=False)


def test_inert_when_unset_or_another_point(monkeypatch: pytest.MonkeyPatch) -> None:
    faults.fault_point("save.policy")
    monkeypatch.setenv("SC_APP_FAULT_AT", "save.loader")
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "raise")
    faults.fault_point("save.policy")
    assert faults._hits == {}


@pytest.mark.parametrize("at", ["save.policy", "*"])
def test_raise_at_the_named_point(monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    monkeypatch.setenv("SC_APP_FAULT_AT", at)
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "raise")
    with pytest.raises(faults.InjectedFault, match=r"save\.policy"):
        faults.fault_point("save.policy")


def test_enospc_is_the_os_error_of_a_full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_APP_FAULT_AT", "save.snapshot")
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "enospc")
    with pytest.raises(OSError) as info:
        faults.fault_point("save.snapshot")
    assert info.value.errno == errno.ENOSPC


def test_after_lets_the_first_hits_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_APP_FAULT_AT", "save.begin")
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "raise")
    monkeypatch.setenv("SC_APP_FAULT_AFTER", "2")
    faults.fault_point("save.begin")
    faults.fault_point("save.begin")
    with pytest.raises(faults.InjectedFault):
        faults.fault_point("save.begin")


def test_several_points_every_and_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_APP_FAULT_AT", "dp.put,dp.clear")
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "raise")
    monkeypatch.setenv("SC_APP_FAULT_AFTER", "1")
    monkeypatch.setenv("SC_APP_FAULT_EVERY", "2")
    monkeypatch.setenv("SC_APP_FAULT_TIMES", "2")
    fired = []
    for hit in range(1, 9):
        try:
            faults.fault_point("dp.put")
        except faults.InjectedFault:
            fired.append(hit)
    assert fired == [3, 5], "after 1 pass, every 2nd hit, at most twice"
    assert faults.take("dp.clear") is None and faults.take("dp.clear") is None
    assert faults.take("dp.clear") == "raise"
    assert faults.take("save.policy") is None
    assert faults._hits.get("save.policy") is None


def test_async_delay_sleeps_this_task_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_APP_FAULT_AT", "save.window")
    monkeypatch.setenv("SC_APP_FAULT_ACTION", "delay")
    monkeypatch.setenv("SC_APP_FAULT_DELAY_S", "0.3")

    async def scenario() -> list[str]:
        order: list[str] = []

        async def other() -> None:
            order.append("other ran")

        delayed = asyncio.create_task(faults.afault_point("save.window"))
        await asyncio.sleep(0)
        await other()
        await delayed
        order.append("delay done")
        return order

    started = time.monotonic()
    assert asyncio.run(scenario()) == ["other ran", "delay done"]
    assert time.monotonic() - started >= 0.3  # the delay happened (a lower bound, not a speed assertion)


def test_kill_sigkills_the_process_and_leaves_a_marker(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    env = {"SC_APP_FAULT_AT": "save.rename", "SC_APP_FAULT_MARKER": str(marker), "PATH": "/usr/bin:/bin"}
    code = "from sc_app.faults import fault_point; fault_point('save.rename'); print('survived')"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == -signal.SIGKILL and "survived" not in out.stdout
    assert marker.read_text() == "save.rename\n"


def test_save_points_are_unique_and_in_order() -> None:
    assert len(set(faults.SAVE_POINTS)) == len(faults.SAVE_POINTS)
    assert faults.SAVE_POINTS[0] == "save.window" and faults.SAVE_POINTS[-1] == "save.done"
