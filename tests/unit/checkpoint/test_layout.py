"""checkpoint.layout: bundle and leftover names."""

from __future__ import annotations

from sc_app.checkpoint import layout


def test_layout_names() -> None:
    assert layout.step_name(12) == "step_12" and layout.tmp_name(12) == "tmp_step_12"
    assert layout.parse_step("step_12") == 12
    assert layout.parse_step("tmp_step_12") is None and layout.parse_step("step_x") is None
    assert layout.parse_step("step_12.bak") is None
    assert layout.parse_tmp("tmp_step_3") == 3 and layout.parse_tmp("step_3") is None


def test_a_leased_writer_names_its_tmp_dir() -> None:
    assert layout.tmp_name(7, "3fa9c2e1b7d0") == "tmp_step_7.3fa9c2e1b7d0"
    assert layout.parse_tmp("tmp_step_7.3fa9c2e1b7d0") == 7
    assert layout.parse_tmp("tmp_step_7.a/b") is None and layout.parse_tmp("tmp_step_7.") is None
