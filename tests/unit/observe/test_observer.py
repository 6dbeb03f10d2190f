"""JobObserver on real bundles, a real lease and a real run log; metrics go to a recording sink (pure mapping)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from sc_app.checkpoint import plan_resume
from sc_app.checkpoint.lease import Lease
from sc_app.observe.observer import JobObserver, ObserveOptions
from sc_app.observe.reader import read_history
from sc_app.observe.records import LOG_FILE, Event, StepRecord
from tests.support.bundles import make_bundle, make_tmp_leftover


class Recorder:
    def __init__(self) -> None:
        self.steps: list[tuple[int, list[float]]] = []
        self.events: list[str] = []
        self.dropped_n: list[int] = []
        self.ticks = 0

    def step(self, rec: StepRecord, commit_waits: Sequence[float] = ()) -> None:
        self.steps.append((rec.step, list(commit_waits)))

    def event(self, ev: Event, *, at: float | None = None) -> None:
        self.events.append(ev.name)

    def dropped(self, n: int) -> None:
        self.dropped_n.append(n)

    def tick(self) -> None:
        self.ticks += 1


def rec(step: int) -> StepRecord:
    return StepRecord(step, 0.5, 0.0, 1.0, -0.1, 1.0, 64, 0.1, step)


def test_an_attempt_records_how_it_started_ran_and_ended(tmp_path: Path) -> None:
    make_bundle(tmp_path, 4)
    make_tmp_leftover(tmp_path, 6)
    Lease.acquire(tmp_path, "earlier")
    lease = Lease.acquire(tmp_path, "now")
    plan = plan_resume(tmp_path, tidy=True)
    assert plan.decision == "resume" and plan.quarantined
    logs = tmp_path / "logs"
    obs = JobObserver.open(
        ObserveOptions(logs, tensorboard=False), run_id="now", lease=lease, plan=plan, max_steps=8, save_period=2
    )
    sink = Recorder()
    obs.attach_metrics(sink)
    assert sink.events == ["resume"], "the resume happened before Ray: metrics get it once attached"
    for s in (5, 6):
        obs.step(rec(s), commit_waits=[0.001])
    obs.event(Event("save", 6, {"bundle": "step_6", "seconds": 0.2}))
    result = obs.finish(143, "stopped on SIGTERM", 6)
    assert result is not None and result.dropped.total == 0
    assert obs.finish(1) is None, "finish is idempotent"

    h = read_history(logs)
    names = [e.name for e in h.events]
    assert names == ["start", "lease_taken", "quarantine", "resume", "save", "exit"]
    start, lease_ev, quarantine, resume, _, exit_ev = h.events
    assert start.step == 4 and start.data["decision"] == "resume" and start.data["max_steps"] == 8
    assert lease_ev.data == {"epoch": 2, "previous_run_id": "earlier", "previous_epoch": 1}
    assert quarantine.data["moved"] and "tmp_step_6" in quarantine.data["moved"][0]
    assert resume.data["bundle"] == "step_4"
    assert exit_ev.data["code"] == 143 and exit_ev.data["final_step"] == 6
    assert all(e.stamp.attempt == 2 and e.stamp.run_id == "now" for e in h.events)
    assert [s.step for s in h.steps] == [5, 6]
    assert sink.steps == [(5, [0.001]), (6, [0.001])] and sink.events == ["resume", "save"]


def test_with_the_log_off_metrics_still_see_everything(tmp_path: Path) -> None:
    plan = plan_resume(tmp_path / "empty", tidy=True)
    obs = JobObserver.open(ObserveOptions(None), run_id="r", lease=None, plan=plan, max_steps=2, save_period=1)
    sink = Recorder()
    obs.attach_metrics(sink)
    obs.step(rec(1))
    obs.event(Event("save", 1, {"seconds": 0.1}))
    assert obs.finish(0) is None
    assert sink.steps == [(1, [])] and sink.events == ["save"] and sink.ticks == 1
    assert not (tmp_path / "empty").exists(), "no log directory is made when the log is off"


def test_records_lost_on_a_stalled_volume_reach_the_metrics(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    os.mkfifo(logs / LOG_FILE)  # a hung volume: the writer thread blocks opening it
    plan = plan_resume(tmp_path / "ckpt", tidy=True)
    obs = JobObserver.open(
        ObserveOptions(logs, log_buffer=5, tensorboard=False, close_timeout_s=60),
        run_id="r",
        lease=None,
        plan=plan,
        max_steps=100,
        save_period=10,
    )
    sink = Recorder()
    obs.attach_metrics(sink)
    assert obs.writer is not None
    deadline = time.monotonic() + 60
    while obs.writer.buffered:  # the thread took the start event and is stuck in open()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for s in range(1, 31):
        obs.step(rec(s))
    obs.tick()
    assert sum(sink.dropped_n) == obs.writer.dropped.total == 25
    drained: list[str] = []

    def drain() -> None:
        with open(logs / LOG_FILE) as fh:
            drained.extend(fh.read().splitlines())

    reader = threading.Thread(target=drain)
    reader.start()
    result = obs.finish(0, final_step=30)
    reader.join(60)
    assert result is not None and result.unwritten == 0
    assert any('"event":"dropped"' in line and '"steps":25' in line for line in drained)
    assert '"event":"exit"' in drained[-1]
