"""A stop whose budget is shorter than the saves take (issue 19, finding 5): real CLI, real Ray, real files.

Every save is slowed on purpose (``SC_APP_FAULT_ACTION=delay`` at ``save.fsync``: a slow volume) to 4 s, and the
stop's budget (``checkpoint.emergency_budget_s``) is 3 s, as a short preemption notice would make it. The stop is
asked right after a periodic bundle was published, long before the next one is due (``save_period`` 200), so no
save is in flight: the driver must not start an emergency bundle it cannot finish — it says so, exits 143 at once,
and the periodic bundle stays the resume point. ``preemption_notice_s`` makes every such save warned about.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from tests.support.cli import InProcess
from tests.support.proc import kill_session, read_trace, start_logged, wait_for

pytestmark = pytest.mark.slow


def test_no_emergency_bundle_that_could_not_finish(cli: InProcess, tmp_path: Path) -> None:
    ckpt, trace, log = tmp_path / "ckpt", tmp_path / "trace.jsonl", tmp_path / "run.log"
    env = {"SC_APP_FAULT_AT": "save.fsync", "SC_APP_FAULT_ACTION": "delay", "SC_APP_FAULT_DELAY_S": "4"}
    live = start_logged(
        "run",
        "--checkpoint-dir",
        str(ckpt),
        "--max-steps",
        "100000",
        "--set",
        "checkpoint.save_period=200",
        "--set",
        "checkpoint.emergency_budget_s=3",
        "--set",
        "checkpoint.preemption_notice_s=2",
        "--set",
        f"run.trace_file={trace}",
        log=log,
        env=env,
    )
    try:
        wait_for(lambda: (ckpt / "step_200").is_dir(), 400, "the first periodic bundle", live)
        stopped = cli("stop", "--checkpoint-dir", str(ckpt), "--wait", "60", within=120)
        assert stopped.rc == 0, stopped.out
        assert live.wait(timeout=60) == 143
    finally:
        kill_session(live.pid)
    out = log.read_text()
    trained = max(e["step"] for e in read_trace(trace) if e["ev"] == "train")
    assert trained < 400, "stopped before the next periodic save was due"
    took = re.search(r"emergency bundle skipped: recent saves took up to (\d+\.\d)s", out)
    assert took is not None and float(took.group(1)) >= 4.0, out[-3000:]  # the 4 s delay, plus whatever load adds
    assert f"stopped on request at step {trained} without an emergency bundle" in out, out[-3000:]
    assert "a rerun resumes from step_200" in out
    slow = re.search(r"save of step_200 took (\d+\.\d)s, longer than checkpoint.preemption_notice_s=2s", out)
    assert slow is not None and float(slow.group(1)) >= 4.0, out[-3000:]
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_200"] and verify_bundle(ckpt / "step_200").ok
    assert not list(ckpt.glob("tmp_step_*")), "no half-written emergency bundle left behind"
