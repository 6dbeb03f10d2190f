"""Failed data-plane calls recovered in-job (real CLI, real Ray, real TransferQueue in a subprocess).

One run with injected partial failures (``sc_app.faults``: half of the rows written or cleared, then the call
raises) at the commit put, the advantage write and the clear, several of each, while bundles are cut every 2
steps. The run must finish with exit 0 and no process exit in between; every fault is retried and recovered,
printed as one line and logged as a ``fault`` event with its cost (no prompt lost or trained twice); every save's
inventory check held (a save cut with an orphan row fails); every bundle verifies; no prompt is trained twice.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sc_app.observe.reader import read_history
from tests.support.proc import read_trace, run_args, sc_app

pytestmark = pytest.mark.slow

FAULTS = {
    "SC_APP_FAULT_AT": "dp.put,dp.write,dp.clear",
    "SC_APP_FAULT_ACTION": "raise",
    "SC_APP_FAULT_AFTER": "1",
    "SC_APP_FAULT_EVERY": "3",  # a retry is the next hit: it passes, so each fault costs one retry
    "SC_APP_FAULT_TIMES": "3",
}


def test_injected_put_write_and_clear_failures_are_recovered_in_job(tmp_path: Path) -> None:
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    # 12 steps: the third clear fault needs the 8th or a later clear call, and a step makes about one (8 steps fell
    # one short once, under load)
    run = sc_app(*run_args(ckpt, trace, 12), env=FAULTS)
    assert run.rc == 0, run.out[-4000:]
    assert "done: step 12" in run.out
    assert "Traceback" not in run.out
    printed = [line for line in run.out.splitlines() if " fault data_plane." in line]
    assert printed and all(": recovered after 2 attempts" in line for line in printed), printed

    events = [e for e in read_history(ckpt / "logs").events_named("fault")]
    kinds = Counter(e.data["fault"] for e in events)
    assert kinds["data_plane.put"] == 3 and kinds["data_plane.clear"] == 3, kinds
    assert kinds["data_plane.write"] >= 1, kinds
    for e in events:
        assert e.data["outcome"] == "recovered" and e.data["attempts"] == 2
        assert e.data["prompts_lost"] == e.data["prompts_duplicated"] == e.data["steps_redone"] == 0
        assert e.data["detection_s"] >= 0 and 0 < e.data["recovery_s"] < 30
        assert "fault injected at dp." in e.data["error"]
    assert len(printed) == len(events)

    starts = [e for e in read_trace(trace) if e["ev"] == "start"]
    assert len(starts) == 1, "the faults were recovered in-job: one start, no retry of the job"
    trained = [p for e in read_trace(trace) if e["ev"] == "train" for p in e["prompts"]]
    repeats = [p for p, n in Counter(trained).items() if n > 1]
    assert not repeats, f"prompts trained twice: {repeats[:10]}"

    published = [e.step for e in read_history(ckpt / "logs").events_named("save")]
    assert published == [2, 4, 6, 8, 10, 12], "every save's window checks index == stored rows: an orphan row fails it"
    kept = sorted(int(p.name[5:]) for p in ckpt.glob("step_*"))
    assert kept and set(kept) <= {2, 4, 6, 8, 10, 12}
    for step in kept:
        manifest = json.loads((ckpt / f"step_{step}" / "manifest.json").read_text())
        assert manifest["replay"]["rows"] % 8 == 0
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    assert verify.rc == 0, verify.out


def test_a_put_that_keeps_failing_stops_the_run_with_one_line_and_leaves_no_row(tmp_path: Path) -> None:
    """Retries spent: the put's rows are removed, the run stops with exit 1 and one line (no traceback), the bundles
    published before verify, and a rerun without the fault resumes and finishes."""
    ckpt, trace = tmp_path / "ckpt", tmp_path / "trace.jsonl"
    env = {"SC_APP_FAULT_AT": "dp.put", "SC_APP_FAULT_ACTION": "raise", "SC_APP_FAULT_AFTER": "12"}
    run = sc_app(*run_args(ckpt, trace, 40, "--set", "data_plane.retries=1"), env=env)
    assert run.rc == 1, run.out[-4000:]
    errors = [line for line in run.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1 and "Traceback" not in run.out, run.out[-4000:]
    assert "data-plane put of" in errors[0] and "failed 2 times" in errors[0] and "were removed" in errors[0]
    (fault,) = [e for e in read_history(ckpt / "logs").events_named("fault") if e.data["outcome"] != "recovered"]
    assert fault.data["outcome"] == "rolled_back" and fault.data["rows_removed"] > 0
    verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    assert verify.rc == 0, verify.out
    again = sc_app(*run_args(ckpt, trace, 8))
    assert again.rc == 0 and "done: step 8" in again.out, again.out[-3000:]
