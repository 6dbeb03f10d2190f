"""The suite's one interrupted run: four attempts of the real CLI on one checkpoint directory (real Ray,
TransferQueue, files), built once per test session and shared read-only by the tests that check it
(``tests/e2e/test_run.py``, ``test_observe.py``, ``test_reliability.py``) through the ``interrupted_run`` fixture.

A. fresh, ``--max-steps 4``, a bundle every 2 steps: exit 0, ``step_2`` and ``step_4`` (copied to ``pristine/``
   before anything else touches the directory: the bundles the corruption tests damage copies of);
B. resumes from ``step_4`` towards a far-away ``--max-steps``; its third save (step 10) hangs in its disk phase
   (``save.policy``, fault action ``delay``) after ``tmp_step_10.*/`` was made, so training logs a step or two past
   the newest bundle ``step_8``; then the whole session is SIGKILLed — no exit event, a leftover tmp dir;
C. resumes from ``step_8`` (the leftover quarantined), redoes the steps B trained past it, serves its metrics on an
   embedded export port (scraped here), and is stopped with SIGTERM: an emergency bundle, exit 143;
D. resumes from the emergency bundle and finishes (exit 0).
Every attempt writes the same JSONL trace and keeps every bundle (``checkpoint.keep=100``), so the tests can read
the bundle each attempt resumed from. Users must not change the directory: copy it first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.support.proc import kill_session, read_trace, sc_app, start_logged, step_bundles, trace_runs, wait_for
from tests.support.prometheus import free_port, one, try_scrape

LONG = 500  # max steps of the attempts that are killed or stopped: they never get there
HUNG_SAVE = 10  # B's third save (6, 8, 10) hangs: B's newest bundle is step_8
SCRAPE_INTERVAL_MS = "2000"  # RAY_metrics_report_interval_ms for C, so its metrics show within seconds
RUN_TIMEOUT = 600


@dataclass
class Interrupted:
    base: Path
    ckpt: Path
    pristine: Path  # copy of A's directory taken before B started
    trace: Path
    outs: dict[str, str]  # attempt letter -> its output
    bundle_step: int  # B's newest complete bundle when it was killed (C resumed from it)
    b_last_trained: int  # B's last trained step (trace)
    high_water: int  # B's last logged step (run log)
    tmp_leftovers: list[str]  # tmp_step_* names when B was killed
    scraped: dict[str, Any]  # C's export port, scraped once it showed a step past B's high water
    c_rc: int
    stopped_at: int  # C's emergency bundle
    final: int  # D's --max-steps


def args(ckpt: Path, trace: Path, max_steps: int, save_period: int, *sets: str) -> list[str]:
    base = ["run", "--checkpoint-dir", str(ckpt), "--max-steps", str(max_steps)]
    keys = [f"checkpoint.save_period={save_period}", f"run.trace_file={trace}", *sets]
    return base + [a for kv in keys for a in ("--set", kv)]


def history(logs: Path) -> Any:
    from sc_app.observe.reader import RunHistory, read_history

    return read_history(logs) if (logs / "metrics.jsonl").exists() else RunHistory(logs / "metrics.jsonl")


def logged(logs: Path, attempt: int) -> list[int]:
    return [s.step for s in history(logs).steps if s.stamp.attempt == attempt]


def logged_saves(logs: Path, attempt: int) -> list[int]:
    return [e.step for e in history(logs).events_named("save") if e.stamp.attempt == attempt]


def tensorboard_steps(logs: Path) -> set[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logs))
    acc.Reload()
    return {e.step for e in acc.Scalars("train/reward_mean")} if "train/reward_mean" in acc.Tags()["scalars"] else set()


def attempt_a(base: Path, ckpt: Path, trace: Path) -> str:
    a = sc_app(*args(ckpt, trace, 4, 2), timeout=RUN_TIMEOUT)
    assert a.rc == 0, f"attempt A: exit {a.rc}\n{a.out[-4000:]}"
    shutil.copytree(ckpt, base / "pristine")
    return a.out


def attempt_b(base: Path, ckpt: Path, trace: Path) -> dict[str, Any]:
    """B: the save of step 10 hangs; SIGKILL once step 10 is logged, B's saves of steps 6 and 8 are in the run
    log and TensorBoard holds B's points up to step 10."""
    logs, log = ckpt / "logs", base / "b.log"
    hang = {"SC_APP_FAULT_AT": "save.policy", "SC_APP_FAULT_ACTION": "delay"}
    hang |= {"SC_APP_FAULT_DELAY_S": "3600", "SC_APP_FAULT_AFTER": "2"}
    proc = start_logged(*args(ckpt, trace, LONG, 2, "checkpoint.keep=100"), log=log, env=hang)
    try:
        wait_for(lambda: HUNG_SAVE in logged(logs, 2), RUN_TIMEOUT, "attempt B to log step 10", proc, log=log)
        # saves publish behind training: step_8's save event may be logged after step 10 trained
        wait_for(lambda: logged_saves(logs, 2) == [6, 8], 120, "attempt B's saves of steps 6 and 8", proc, log=log)
        wait_for(lambda: HUNG_SAVE in tensorboard_steps(logs), 60, "B's TensorBoard points up to step 10", proc)
        assert sorted(step_bundles(ckpt)) == [2, 4, 6, 8], sorted(step_bundles(ckpt))
        assert len(list(ckpt.glob(f"tmp_step_{HUNG_SAVE}.*"))) == 1  # named after its run
        facts = {
            "bundle_step": max(step_bundles(ckpt)),
            "b_last_trained": max(e["step"] for e in trace_runs(trace)[1] if e["ev"] == "train"),
            "high_water": max(logged(logs, 2)),
            "tmp_leftovers": sorted(p.name for p in ckpt.glob("tmp_step_*")),
        }
    finally:
        kill_session(proc.pid)  # SIGKILL, driver and Ray alike
    assert proc.wait(timeout=30) == -signal.SIGKILL, f"attempt B: exit {proc.returncode}, not SIGKILL"
    return facts


def attempt_c(base: Path, ckpt: Path, trace: Path, high_water: int) -> dict[str, Any]:
    """C: resumes from step_8, is scraped once its metrics show a step past B's high water, then SIGTERM."""
    log, port = base / "c.log", free_port()
    sets = ("checkpoint.keep=100", f"ray.metrics_export_port={port}")
    proc = start_logged(
        *args(ckpt, trace, LONG, 100, *sets), log=log, env={"RAY_metrics_report_interval_ms": SCRAPE_INTERVAL_MS}
    )
    scraped: dict[str, Any] = {}

    def metrics_show_a_step_past_the_redo() -> bool:
        got = try_scrape(port)
        if got.get("ray_sc_app_step") and one(got, "ray_sc_app_step") > high_water:
            scraped.update(got)
            return True
        return False

    try:
        wait_for(metrics_show_a_step_past_the_redo, RUN_TIMEOUT, "attempt C's metrics on its export port", proc)
        os.kill(proc.pid, signal.SIGTERM)  # the driver alone, as Kubernetes signals a pod's PID 1
        rc = proc.wait(timeout=180)
    finally:
        kill_session(proc.pid)
    return {"scraped": scraped, "c_rc": rc, "stopped_at": max(step_bundles(ckpt))}


def build(base: Path) -> Interrupted:
    ckpt, trace = base / "ckpt", base / "trace.jsonl"
    out_a = attempt_a(base, ckpt, trace)
    b = attempt_b(base, ckpt, trace)
    c = attempt_c(base, ckpt, trace, b["high_water"])
    final = c["stopped_at"] + 3
    d = sc_app(*args(ckpt, trace, final, 2, "checkpoint.keep=100"), timeout=RUN_TIMEOUT)
    assert d.rc == 0, f"attempt D: exit {d.rc}\n{d.out[-4000:]}"
    outs = {"A": out_a, "B": (base / "b.log").read_text(), "C": (base / "c.log").read_text(), "D": d.out}
    return Interrupted(base, ckpt, base / "pristine", trace, outs, **b, **c, final=final)


def save(run: Interrupted, path: Path) -> None:
    doc = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(run).items()}
    path.write_text(json.dumps(doc))


def load(path: Path) -> Interrupted:
    doc = json.loads(path.read_text())
    for key in ("base", "ckpt", "pristine", "trace"):
        doc[key] = Path(doc[key])
    return Interrupted(**doc)


def trace_of(run: Interrupted) -> list[list[dict[str, Any]]]:
    """The shared trace split at its ``start`` events: A, B, C, D."""
    runs = trace_runs(run.trace)
    assert len(runs) == 4, [r[0] for r in runs]
    return runs


def events_of(run: Interrupted) -> list[dict[str, Any]]:
    return read_trace(run.trace)


def resumed_from(out: str) -> tuple[str, int]:
    m = re.search(r"resuming from (\S+) \(step (\d+)\)", out)
    assert m, out[-4000:]
    return Path(m.group(1)).name, int(m.group(2))
