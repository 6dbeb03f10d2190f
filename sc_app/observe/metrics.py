"""The job's Prometheus metrics, recorded through Ray's own pipeline (``ray.util.metrics``).

How Ray carries them (Ray 2.60, read in its source and measured here):
* every Ray process — the driver included — is a core worker that sends what it records to the metrics agent
  of *its own node* (``127.0.0.1:<metrics_agent_port>``; a driver joining a cluster with ``address=auto`` learns
  that port from the GCS); the agent serves it with Ray's system metrics on the node's metrics export port
  (``ray start --metrics-export-port``, 8080 in the chart; ``ray.init(_metrics_export_port=...)`` embedded; a
  free port when unset). So these metrics appear on the port of the node the driver runs on: on KubeRay the
  head, where the Jobs API runs the entrypoint. Every node's port carries Ray's own metrics.
* names get Ray's namespace in front: ``sc_app_step`` is scraped as ``ray_sc_app_step``; a counter
  ``sc_app_resumes`` as ``ray_sc_app_resumes_total``; a histogram as ``_bucket``/``_sum``/``_count``.
* a histogram reaches the scrape as bucket counts: its ``_count`` and buckets are exact, its ``_sum`` is rebuilt
  from bucket midpoints (approximate); quantiles (``histogram_quantile``) are what it is for, and the exact newest
  step time is its own gauge.
* a process exports what it recorded every ``metrics_report_interval_ms`` (10 s), and the agent forgets a gauge
  that was not recorded again within two intervals (measured: a gauge set once is gone from the scrape 20-30 s
  later). ``tick()`` therefore re-records every gauge's last value every half interval; counters and histograms
  are cumulative and need nothing.

The driver records them (it sees every progress record; it is not the train pump, so nothing here can slow a
step). Gauges for resumes and saves hold the unix time of the last one, which a Grafana annotation turns into a
marker at that moment (``useValueForTime``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sc_app.observe.records import Event, StepMetrics

RAY_NAMESPACE = "ray"  # what Ray's exporter puts in front of every name

Kind = Literal["gauge", "counter", "histogram"]

STEP_SECONDS_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]
COMMIT_WAIT_BUCKETS = [1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    kind: Kind
    description: str
    boundaries: tuple[float, ...] = ()
    extra_tags: tuple[str, ...] = ()

    @property
    def family(self) -> str:
        """The metric family name a Prometheus scrape shows (``prometheus_client`` parser's ``Metric.name``)."""
        return f"{RAY_NAMESPACE}_{self.name}"

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names it is scraped as."""
        f = self.family
        if self.kind == "counter":
            return (f"{f}_total",)
        if self.kind == "histogram":
            return (f"{f}_bucket", f"{f}_sum", f"{f}_count")
        return (f,)


def _g(name: str, description: str, *extra_tags: str) -> MetricSpec:
    return MetricSpec(name, "gauge", description, extra_tags=extra_tags)


def _c(name: str, description: str) -> MetricSpec:
    return MetricSpec(name, "counter", description)


CATALOGUE: tuple[MetricSpec, ...] = (
    _g("sc_app_step", "Newest train step."),
    _g("sc_app_attempt", "Attempt (checkpoint lease epoch) of the running driver."),
    _c("sc_app_train_steps", "Train steps this attempt trained."),
    MetricSpec("sc_app_step_seconds", "histogram", "Seconds per train step.", tuple(STEP_SECONDS_BUCKETS)),
    _g("sc_app_last_step_seconds", "Seconds the newest train step took."),
    _g("sc_app_reward", "Reward of the newest step's groups (stat: mean, min, max).", "stat"),
    _g("sc_app_loss", "Loss of the newest step."),
    _g("sc_app_staleness", "Mean staleness (weights versions) of the newest step's groups."),
    _g("sc_app_rows_in_tq", "Rows held in TransferQueue after the newest step."),
    _g("sc_app_weights_version", "Trainer weights version."),
    MetricSpec(
        "sc_app_commit_wait_seconds",
        "histogram",
        "Seconds a data-plane commit or drop waited for the checkpoint barrier.",
        tuple(COMMIT_WAIT_BUCKETS),
    ),
    _g("sc_app_save_seconds", "Whole time of the newest published save (written behind training)."),
    _g("sc_app_save_paused_seconds", "Seconds training paused for the newest published save."),
    _g("sc_app_save_window_seconds", "Barrier's exclusive window of the newest published save."),
    _g("sc_app_bundle_bytes", "Data-plane bytes of the newest published bundle."),
    _g("sc_app_last_saved_step", "Step of the newest published bundle."),
    _c("sc_app_saves", "Bundles published by this attempt (periodic, final and emergency)."),
    _c("sc_app_emergency_saves", "Bundles cut on SIGTERM and published."),
    _c("sc_app_failed_saves", "Saves that failed (e.g. full disk); older bundles intact."),
    _c("sc_app_resumes", "Attempts that resumed from a bundle (1 for a resumed attempt)."),
    _g("sc_app_last_save_timestamp_seconds", "Unix time the newest bundle was published."),
    _g("sc_app_last_resume_timestamp_seconds", "Unix time this attempt resumed (absent for a fresh start)."),
    _g("sc_app_last_emergency_save_timestamp_seconds", "Unix time of the newest emergency bundle."),
    _g("sc_app_upload_seconds", "Seconds the newest remote-tier upload took (behind training)."),
    _g("sc_app_upload_bytes", "Bytes of the newest bundle uploaded to the remote tier."),
    _g("sc_app_upload_lag_steps", "Newest local bundle's step minus the newest one published on the bucket."),
    _g("sc_app_last_uploaded_step", "Step of the newest bundle published on the remote tier."),
    _c("sc_app_uploads", "Bundles this attempt published on the remote tier."),
    _c("sc_app_failed_uploads", "Remote-tier uploads that failed (retried; the local bundle is complete)."),
    _c("sc_app_run_log_dropped", "Run-log records lost because the log volume was slower than training."),
    MetricSpec(
        "sc_app_faults",
        "counter",
        "Faults met in-job, by what failed (kind) and how it ended (outcome: recovered, rolled_back, failed).",
        extra_tags=("kind", "outcome"),
    ),
    MetricSpec("sc_app_fault_retries", "counter", "Retries spent on in-job faults, by kind.", extra_tags=("kind",)),
    _g("sc_app_last_recovery_seconds", "Seconds the newest in-job recovery took (failure to success or give-up)."),
    _g("sc_app_goodput", "Productive training seconds / wall seconds of this attempt so far (docs/recovery.md)."),
)
BY_NAME = {m.name: m for m in CATALOGUE}
BASE_TAGS = ("run_id",)


def keepalive_seconds() -> float:
    """Half of Ray's report interval (the agent keeps a gauge for two): a gauge never ages out while we run."""
    import ray

    try:  # the interval Ray's own recorder reads (floored at 1 s there too); RAY_metrics_report_interval_ms sets it
        interval_ms = max(int(ray._config.metrics_report_interval_ms()), 1000)
    except Exception:  # not there in another Ray version: its default
        interval_ms = 10_000
    return interval_ms / 2000


class JobMetrics:
    """The driver's metrics for one attempt. Pre: Ray is initialised in this process.

    Thread-safe: the driver records from its poll loop while the observer's keepalive thread calls ``tick``."""

    def __init__(self, run_id: str, attempt: int) -> None:
        from ray.util import metrics as rm

        self._tags = {"run_id": run_id}
        self._m: dict[str, Any] = {}
        for spec in CATALOGUE:
            keys = BASE_TAGS + spec.extra_tags
            if spec.kind == "gauge":
                m = rm.Gauge(spec.name, spec.description, tag_keys=keys)
            elif spec.kind == "counter":
                m = rm.Counter(spec.name, spec.description, tag_keys=keys)
            else:
                m = rm.Histogram(spec.name, spec.description, boundaries=list(spec.boundaries), tag_keys=keys)
            self._m[spec.name] = m.set_default_tags(self._tags)
        self._last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._lock = threading.Lock()  # guards _last and _refreshed
        self._keepalive_s = keepalive_seconds()
        self._refreshed = time.monotonic()
        self._set("sc_app_attempt", attempt)

    # ------------------------------------------------------------------ primitives
    def _set(self, name: str, value: float | None, **tags: str) -> None:
        if value is None or not math.isfinite(value):
            return
        with self._lock:
            self._m[name].set(float(value), tags=tags or None)
            self._last[(name, tuple(sorted(tags.items())))] = float(value)

    def _inc(self, name: str, value: float = 1.0, **tags: str) -> None:
        if value > 0:
            self._m[name].inc(value, tags=tags or None)

    def _observe(self, name: str, value: float) -> None:
        if math.isfinite(value) and value >= 0:
            self._m[name].observe(value)

    # ------------------------------------------------------------------ what the driver sees
    def step(self, rec: StepMetrics, commit_waits: Sequence[float] = ()) -> None:
        self._set("sc_app_step", rec.step)
        self._inc("sc_app_train_steps")
        self._observe("sc_app_step_seconds", rec.step_seconds)
        self._set("sc_app_last_step_seconds", rec.step_seconds)
        self._set("sc_app_reward", rec.reward_mean, stat="mean")
        self._set("sc_app_reward", rec.reward_min, stat="min")
        self._set("sc_app_reward", rec.reward_max, stat="max")
        self._set("sc_app_loss", rec.loss)
        self._set("sc_app_staleness", rec.staleness)
        self._set("sc_app_rows_in_tq", rec.rows_held)
        self._set("sc_app_weights_version", rec.weights_version)
        for wait in commit_waits:
            self._observe("sc_app_commit_wait_seconds", wait)

    def event(self, ev: Event, *, at: float | None = None) -> None:
        """Count and time the events Prometheus shows; others are ignored. ``at``: unix time (default now)."""
        now = time.time() if at is None else at
        d = ev.data
        if ev.name in ("save", "emergency_save"):
            self._inc("sc_app_saves")
            self._set("sc_app_save_seconds", d.get("seconds"))
            self._set("sc_app_save_paused_seconds", d.get("paused_seconds"))
            self._set("sc_app_save_window_seconds", d.get("window_seconds"))
            self._set("sc_app_bundle_bytes", d.get("bytes"))
            self._set("sc_app_last_saved_step", ev.step)
            self._set("sc_app_last_save_timestamp_seconds", now)
            if ev.name == "emergency_save":
                self._inc("sc_app_emergency_saves")
                self._set("sc_app_last_emergency_save_timestamp_seconds", now)
        elif ev.name == "save_failed":
            self._inc("sc_app_failed_saves")
        elif ev.name == "upload":
            self._inc("sc_app_uploads")
            self._set("sc_app_upload_seconds", d.get("seconds"))
            self._set("sc_app_upload_bytes", d.get("bytes"))
            self._set("sc_app_upload_lag_steps", d.get("lag_steps"))
            self._set("sc_app_last_uploaded_step", ev.step)
        elif ev.name == "upload_failed":
            self._inc("sc_app_failed_uploads")
            self._set("sc_app_upload_lag_steps", d.get("lag_steps"))
        elif ev.name == "fault":
            kind = str(d.get("fault"))
            self._inc("sc_app_faults", kind=kind, outcome=str(d.get("outcome")))
            self._inc("sc_app_fault_retries", float(d.get("attempts") or 1) - 1, kind=kind)
            self._set("sc_app_last_recovery_seconds", d.get("recovery_s"))
        elif ev.name == "goodput":
            self._set("sc_app_goodput", d.get("goodput"))
        elif ev.name == "resume":
            self._inc("sc_app_resumes")
            self._set("sc_app_last_resume_timestamp_seconds", now)
            self._set("sc_app_step", ev.step)

    def dropped(self, n: int) -> None:
        """``n`` more run-log records were lost."""
        self._inc("sc_app_run_log_dropped", n)

    def tick(self) -> None:
        """Re-record every gauge's last value once ``keepalive_s`` passed, so Ray's agent keeps serving it."""
        with self._lock:
            if time.monotonic() - self._refreshed < self._keepalive_s:
                return
            self._refreshed = time.monotonic()
            for (name, tags), value in self._last.items():
                self._m[name].set(value, tags=dict(tags) or None)
