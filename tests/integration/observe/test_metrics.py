"""sc-app's job metrics on the real metrics export endpoint of a real Ray, parsed with ``prometheus_client``.

``tests/support/metrics_probe.py`` is a driver: it starts an embedded Ray with a metrics export port and records a fixed
scenario through ``JobMetrics``. The test scrapes ``http://127.0.0.1:PORT/metrics`` — Ray's own exporter, fed by
Ray's metrics agent — until every metric of the catalogue is there, checks each value against what was recorded,
then waits several report intervals without new records: the gauges must still be served (Ray's agent drops a
gauge that is not recorded again within two intervals; ``JobMetrics.tick`` re-records them).
The report interval is set to 2 s (``RAY_metrics_report_interval_ms``, a Ray setting) so this takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sc_app.observe.metrics import BY_NAME, CATALOGUE
from tests.support.proc import REPO, kill_session, ray_did_not_start
from tests.support.prometheus import free_port, one, scrape, try_scrape

pytest.importorskip("prometheus_client.parser", reason="prometheus_client (dev extra) is not installed")
pytestmark = pytest.mark.slow

REPORT_INTERVAL_MS = 2000


def wait_for_all(port: int, proc: subprocess.Popen[str], timeout: float) -> dict[str, list[tuple[dict, float]]]:
    wanted = {name for spec in CATALOGUE for name in spec.series}
    deadline = time.monotonic() + timeout
    got: dict[str, list[tuple[dict, float]]] = {}
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the probe driver exited early"
        got = try_scrape(port)
        if wanted <= set(got):
            return got
        time.sleep(0.5)
    raise AssertionError(f"not on the endpoint after {timeout}s: {sorted(wanted - set(got))}")


@pytest.fixture
def probe(tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[str], dict]]:
    port = free_port()
    env = {**os.environ, "RAY_metrics_report_interval_ms": str(REPORT_INTERVAL_MS), "PYTHONPATH": str(REPO)}
    err = tmp_path / "probe.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "support" / "metrics_probe.py"), str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
            env=env,
        )
    try:
        assert proc.stdout is not None
        recorded = json.loads(proc.stdout.readline() or "{}")
        if not recorded:  # why, not only that: a Ray that could not start in time is the suite's one rerun case
            proc.wait(timeout=60)
            ray_did_not_start(err.read_text())
        assert recorded, f"the probe driver did not start (tests/support/metrics_probe.py): {err.read_text()[-2000:]}"
        yield port, proc, recorded
    finally:
        if proc.stdin:
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        kill_session(proc.pid)


def test_the_driver_metrics_are_served_on_rays_export_port_and_stay_there(probe: tuple) -> None:
    port, proc, recorded = probe
    got = wait_for_all(port, proc, timeout=120)
    for name, rows in got.items():
        assert all(lab.get("run_id") == "probe-run" for lab, _ in rows), f"{name} lacks the run_id label: {rows}"

    assert one(got, "ray_sc_app_step") == 13
    assert one(got, "ray_sc_app_attempt") == 2
    assert one(got, "ray_sc_app_train_steps_total") == recorded["steps"]
    assert one(got, "ray_sc_app_step_seconds_count") == 3
    # Ray's agent rebuilds a histogram from bucket counts: _sum is bucket midpoints (0.2 s lies in (0.1, 0.25])
    assert 3 * 0.1 <= one(got, "ray_sc_app_step_seconds_sum") <= 3 * 0.25
    assert one(got, "ray_sc_app_last_step_seconds") == 0.2  # the exact value
    assert one(got, "ray_sc_app_reward", stat="mean") == pytest.approx(0.63)
    assert one(got, "ray_sc_app_reward", stat="min") == 0.25
    assert one(got, "ray_sc_app_reward", stat="max") == 1.0
    assert one(got, "ray_sc_app_loss") == pytest.approx(-0.13)
    assert one(got, "ray_sc_app_staleness") == 1.0
    assert one(got, "ray_sc_app_rows_in_tq") == 53
    assert one(got, "ray_sc_app_weights_version") == 13

    waits = recorded["commit_waits"]
    assert one(got, "ray_sc_app_commit_wait_seconds_count") == len(waits)
    buckets = {float(lab["le"]): v for lab, v in got["ray_sc_app_commit_wait_seconds_bucket"]}
    for le, count in buckets.items():  # cumulative, as Prometheus' histogram_quantile (p99) expects
        assert count == sum(1 for w in waits if w <= le), f"bucket le={le}"
    assert buckets[float("inf")] == len(waits)

    assert one(got, "ray_sc_app_save_seconds") == 0.9  # the newest published save: the emergency one
    assert one(got, "ray_sc_app_save_paused_seconds") == 0.004
    assert one(got, "ray_sc_app_save_window_seconds") == 0.001
    assert one(got, "ray_sc_app_bundle_bytes") == 8192
    assert one(got, "ray_sc_app_last_saved_step") == 13
    assert one(got, "ray_sc_app_saves_total") == 2
    assert one(got, "ray_sc_app_emergency_saves_total") == 1
    assert one(got, "ray_sc_app_failed_saves_total") == 1
    assert one(got, "ray_sc_app_resumes_total") == 1
    assert one(got, "ray_sc_app_uploads_total") == 1 and one(got, "ray_sc_app_failed_uploads_total") == 1
    assert one(got, "ray_sc_app_upload_seconds") == 2.5 and one(got, "ray_sc_app_upload_bytes") == 4096
    assert one(got, "ray_sc_app_upload_lag_steps") == 1 and one(got, "ray_sc_app_last_uploaded_step") == 12
    assert one(got, "ray_sc_app_last_resume_timestamp_seconds") == 1_700_000_000.0
    assert one(got, "ray_sc_app_last_emergency_save_timestamp_seconds") == 1_700_000_100.0
    assert one(got, "ray_sc_app_run_log_dropped_total") == 5
    assert one(got, "ray_sc_app_faults_total", kind="data_plane.put", outcome="recovered") == 1
    assert one(got, "ray_sc_app_faults_total", kind="data_plane.clear", outcome="recovered") == 1
    assert one(got, "ray_sc_app_fault_retries_total", kind="data_plane.put") == 2
    assert one(got, "ray_sc_app_fault_retries_total", kind="data_plane.clear") == 1
    assert one(got, "ray_sc_app_last_recovery_seconds") == 0.125
    assert one(got, "ray_sc_app_goodput") == 0.75
    assert BY_NAME["sc_app_step"].family == "ray_sc_app_step"

    time.sleep(4 * REPORT_INTERVAL_MS / 1000)  # twice the agent's gauge lifetime, with nothing new recorded
    later = scrape(port)
    gauges = [spec for spec in CATALOGUE if spec.kind == "gauge"]
    missing = [spec.family for spec in gauges if spec.family not in later]
    assert not missing, f"gauges aged out of Ray's agent although the driver still runs: {missing}"
    assert one(later, "ray_sc_app_step") == 13
