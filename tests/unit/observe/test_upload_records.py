"""The remote tier's uploads as the run reports them: the printed line, the run-log event, the report's line."""

from __future__ import annotations

from pathlib import Path

from sc_app.observe.observer import translate
from sc_app.observe.reader import read_history
from sc_app.observe.records import Event
from sc_app.observe.report import markdown, summarize
from sc_app.observe.runlog import RunLogOptions, RunLogWriter
from sc_app.progress import UploadRecord, format_line


def test_an_upload_is_a_line_and_an_event() -> None:
    ok = UploadRecord(4, "step_4", 3 * 2**20, 1.25, 2)
    assert format_line(ok, 10) == "step    4/10  uploaded step_4 (3.0 MiB in 1.25s, remote 2 steps behind)"
    assert translate(ok) == (None, [Event("upload", 4, {"bundle": "step_4", "bytes": 3 * 2**20, "seconds": 1.25,
                                                        "lag_steps": 2})])  # fmt: skip
    bad = UploadRecord(6, "step_6", 0, 0.0, 2, error="s3://b/k: 503")
    assert format_line(bad, 10) == "step    6/10  upload of step_6 failed (retried): s3://b/k: 503"
    assert translate(bad)[1][0].name == "upload_failed"


def test_the_report_summarises_the_uploads(tmp_path: Path) -> None:
    w = RunLogWriter(RunLogOptions(tmp_path, run_id="r1", attempt=1, start_step=0, tensorboard=False)).start()
    for record in (UploadRecord(2, "step_2", 2**20, 1.0, 0), UploadRecord(4, "step_4", 2**20, 3.0, 0),
                   UploadRecord(6, "step_6", 0, 0.0, 1, error="503")):  # fmt: skip
        for ev in translate(record)[1]:
            w.event(ev)
    w.close()
    s = summarize(read_history(tmp_path))
    assert s.remote == {"uploads": 2, "failed": 1, "seconds_max": 3.0, "bytes": 2 * 2**20, "lag_steps_last": 1.0,
                        "newest_step": 4}  # fmt: skip
    assert "- remote tier: 2 bundles uploaded (2.0 MiB), 1 failed uploads (retried); newest on the bucket step_4" in (
        markdown(s)
    )
