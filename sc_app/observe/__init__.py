"""Watching a job: the run log that survives retries, TensorBoard scalars, Prometheus metrics, plots.

* ``records``  — what one line of ``metrics.jsonl`` holds (a train step or an event); pure.
* ``runlog``   — the writer: a bounded buffer the driver hands records to, one background thread that appends
                 them (and TensorBoard scalars) to the log directory; it never blocks its caller.
* ``reader``   — reads a run log back across attempts: the effective step series, events, torn lines skipped.
* ``metrics``  — the job's Prometheus metrics, recorded through Ray's own pipeline (``ray.util.metrics``).
* ``report``   — ``sc-app report``: PNG plots and a Markdown summary from a run log.
"""
