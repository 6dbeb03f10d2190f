"""Failed data-plane calls recovered in-job (real CLI, real Ray, real TransferQueue in subprocesses).

One checkpoint directory, two runs (``runs``, built once for this module):
  F. a put that keeps failing (``data_plane.retries=1``, every put from the 13th on raises): its rows are removed
     and the run stops with exit 1 and one line, the bundles it published before intact;
  G. the rerun: it resumes F's newest bundle and trains 12 steps more with injected partial failures
     (``sc_app.faults``: half of the rows written or cleared, then the call raises) at the commit put, the advantage
     write and the clear, several of each, while bundles are cut every 2 steps. G must finish with exit 0 and no
     process exit in between; every fault is retried and recovered, printed as one line and logged as a ``fault``
     event with its cost (no prompt lost or trained twice); every save's inventory check held (a save cut with an
     orphan row fails); every bundle verifies; no prompt is trained twice in the history the two runs kept.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from sc_app.observe.reader import read_history
from tests.support.cli import InProcess
from tests.support.proc import Finished, read_trace, run_args, sc_app
from tests.support.restart import kept_history

pytestmark = pytest.mark.slow

FAULTS = {
    "SC_APP_FAULT_AT": "dp.put,dp.write,dp.clear",
    "SC_APP_FAULT_ACTION": "raise",
    "SC_APP_FAULT_AFTER": "1",
    "SC_APP_FAULT_EVERY": "3",  # a retry is the next hit: it passes, so each fault costs one retry
    "SC_APP_FAULT_TIMES": "3",
}
# 12 steps: the third clear fault needs the 8th or a later clear call, and a step makes about one (8 steps fell one
# short once, under load)
G_STEPS = 12


@dataclass
class Runs:
    ckpt: Path
    trace: Path
    f: Finished
    f_verify: Finished  # ckpt verify right after F
    g: Finished
    g_from: int  # the bundle G resumed (F's newest)
    g_max: int


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    base = tmp_path_factory.mktemp("in-job-recovery")
    ckpt, trace = base / "ckpt", base / "trace.jsonl"
    env = {"SC_APP_FAULT_AT": "dp.put", "SC_APP_FAULT_ACTION": "raise", "SC_APP_FAULT_AFTER": "12"}
    f = sc_app(*run_args(ckpt, trace, 40, "--set", "data_plane.retries=1"), env=env)
    f_verify = sc_app("ckpt", "verify", "--checkpoint-dir", str(ckpt), timeout=120)
    g_from = max((int(p.name[5:]) for p in ckpt.glob("step_*") if p.name[5:].isdigit()), default=0)
    g = sc_app(*run_args(ckpt, trace, g_from + G_STEPS), env=FAULTS)
    return Runs(ckpt, trace, f, f_verify, g, g_from, g_from + G_STEPS)


def test_a_put_that_keeps_failing_stops_the_run_with_one_line_and_leaves_no_row(runs: Runs) -> None:
    """Retries spent: the put's rows are removed, the run stops with exit 1 and one line (no traceback), the bundles
    published before verify, and a rerun resumes and finishes."""
    run = runs.f
    assert run.rc == 1, run.out[-4000:]
    errors = [line for line in run.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1 and "Traceback" not in run.out, run.out[-4000:]
    assert "data-plane put of" in errors[0] and "failed 2 times" in errors[0] and "were removed" in errors[0]
    f_faults = [e for e in read_history(runs.ckpt / "logs").events_named("fault") if e.stamp.attempt == 1]
    (fault,) = [e for e in f_faults if e.data["outcome"] != "recovered"]
    assert fault.data["outcome"] == "rolled_back" and fault.data["rows_removed"] > 0
    assert runs.f_verify.rc == 0, runs.f_verify.out
    again = runs.g
    assert again.rc == 0 and f"done: step {runs.g_max}" in again.out, again.out[-3000:]
    assert runs.g_from > 0 and f"resuming from {runs.ckpt / f'step_{runs.g_from}'}" in again.out, again.out[-3000:]


def test_injected_put_write_and_clear_failures_are_recovered_in_job(cli: InProcess, runs: Runs) -> None:
    ckpt, trace, run = runs.ckpt, runs.trace, runs.g
    assert run.rc == 0, run.out[-4000:]
    assert f"done: step {runs.g_max}" in run.out
    assert "Traceback" not in run.out
    printed = [line for line in run.out.splitlines() if " fault data_plane." in line]
    assert printed and all(": recovered after 2 attempts" in line for line in printed), printed

    events = [e for e in read_history(ckpt / "logs").events_named("fault") if e.stamp.attempt == 2]
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
    assert len(starts) == 2, "the faults were recovered in-job: one start of the rerun, no retry of the job"
    trained, _ = kept_history(read_trace(trace))  # the steps F trained past its newest bundle were redone
    repeats = [p for p, n in Counter(trained).items() if n > 1]
    assert not repeats, f"prompts trained twice: {repeats[:10]}"

    published = [e.step for e in read_history(ckpt / "logs").events_named("save") if e.stamp.attempt == 2]
    expected = list(range(runs.g_from + 2, runs.g_max + 1, 2))
    assert published == expected, "every save's window checks index == stored rows: an orphan row fails it"
    kept = sorted(int(p.name[5:]) for p in ckpt.glob("step_*") if re.fullmatch(r"\d+", p.name[5:]))
    assert kept and set(kept) <= set(expected)
    for step in kept:
        manifest = json.loads((ckpt / f"step_{step}" / "manifest.json").read_text())
        assert manifest["replay"]["rows"] % 8 == 0
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(ckpt))
    assert verify.rc == 0, verify.out
