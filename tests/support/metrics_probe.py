"""A driver that records sc-app's job metrics on a real local Ray (``tests/integration/observe/test_metrics.py``).

``python tests/support/metrics_probe.py PORT`` starts an embedded Ray whose metrics export port is PORT, records a fixed
scenario through ``JobMetrics`` (what the driver records during a run), prints one JSON line with what it
recorded, then keeps the gauges alive with ``tick()`` until its stdin closes.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import ray

from sc_app.attempt.ray_start import start_ray
from sc_app.observe.metrics import JobMetrics
from sc_app.observe.records import Event, StepMetrics


def main(port: int) -> None:
    start_ray(  # a start that times out on a loaded node (two suites on 2 cores) is retried once, as sc-app's is
        lambda: ray.init(
            address="local",
            num_cpus=1,
            include_dashboard=False,
            _metrics_export_port=port,
            logging_level=logging.WARNING,
            log_to_driver=False,
        ),
        ray.shutdown,
        what="the probe's local Ray",
    )
    m = JobMetrics("probe-run", 2)
    m.event(Event("resume", 10, {"bundle": "step_10"}), at=1_700_000_000.0)
    waits = [0.00002, 0.0003, 0.002]
    for step in (11, 12, 13):
        m.step(
            StepMetrics(
                step=step,
                reward_mean=0.5 + step / 100,
                reward_min=0.25,
                reward_max=1.0,
                loss=-0.01 * step,
                staleness=1.0,
                rows_held=40 + step,
                step_seconds=0.2,
                weights_version=step,
            ),
            commit_waits=waits,
        )
    m.event(Event("save", 12, {"seconds": 1.5, "paused_seconds": 0.003, "window_seconds": 0.002, "bytes": 4096}))
    m.event(Event("save_failed", 13, {"error": "No space left on device"}))
    m.event(
        Event("emergency_save", 13, {"seconds": 0.9, "paused_seconds": 0.004, "window_seconds": 0.001, "bytes": 8192}),
        at=1_700_000_100.0,
    )
    m.dropped(5)
    fault = {"fault": "data_plane.put", "outcome": "recovered", "attempts": 3, "recovery_s": 0.25}
    m.event(Event("fault", 13, fault))
    m.event(Event("fault", 13, {**fault, "fault": "data_plane.clear", "attempts": 2, "recovery_s": 0.125}))
    m.event(Event("goodput", 13, {"goodput": 0.75}))
    m.event(Event("upload", 12, {"bundle": "step_12", "bytes": 4096, "seconds": 2.5, "lag_steps": 1}))
    m.event(Event("upload_failed", 13, {"bundle": "step_13", "error": "s3://b/k: 503", "lag_steps": 1}))
    print(json.dumps({"steps": 3, "commit_waits": waits * 3}), flush=True)
    # keep the gauges alive until the test closes our stdin (bounded: the test never needs more than minutes)
    deadline = time.monotonic() + 600
    import select

    while time.monotonic() < deadline:
        m.tick()
        ready, _, _ = select.select([sys.stdin], [], [], 0.2)
        if ready and not sys.stdin.readline():
            break
    ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]))
