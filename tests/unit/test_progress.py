"""progress: the typed records and the one line each becomes (``sc-app k8s status`` parses these lines)."""

from __future__ import annotations

from sc_app.progress import RunSummary, SaveFailedRecord, SaveRecord, StepRecord, StopRecord, format_line


def test_step_line() -> None:
    rec = StepRecord(step=10, reward=0.0856, loss=-0.00811, staleness=1.0, rows_held=64, step_seconds=0.0912)
    assert format_line(rec, 150) == (
        "step   10/150  reward 0.086  loss -0.0081  staleness 1.00  rows_in_tq   64  0.09s"
    )


def test_save_line() -> None:
    rec = SaveRecord(10, "step_10", 0.11, 0.002, 0.0021, groups=8, data_plane_bytes=4096)
    assert format_line(rec, 150) == "step   10/150  saved step_10 (0.11s, training paused 2 ms, window 2 ms)"


def test_failed_save_and_stop_lines() -> None:
    assert format_line(SaveFailedRecord(12, "disk full"), 150) == "step   12/150  SAVE FAILED: disk full"
    assert format_line(StopRecord(13), 150) == "step   13/150  stop requested"


def test_summary_mean_of_nothing_is_zero() -> None:
    assert RunSummary.mean([]) == 0.0 and RunSummary.mean([1.0, 0.0]) == 0.5


def test_failed_saves_in_a_row_before_any_bundle_name_none_not_step_0() -> None:
    assert format_line(SaveFailedRecord(4, "disk full", in_a_row=2, last_saved_step=0), 150) == (
        "step    4/150  SAVE FAILED (2 in a row; newest bundle none, 4 steps behind): disk full"
    )
    assert "newest bundle step_2, 4 steps behind" in format_line(
        SaveFailedRecord(6, "disk full", in_a_row=2, last_saved_step=2), 150
    )
