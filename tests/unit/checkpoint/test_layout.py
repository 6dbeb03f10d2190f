"""checkpoint.layout: bundle and leftover names."""

from __future__ import annotations

from sc_app.checkpoint import layout


def test_layout_names() -> None:
    assert layout.step_name(12) == "step_12" and layout.tmp_name(12) == "tmp_step_12"
    assert layout.parse_step("step_12") == 12
    assert layout.parse_step("tmp_step_12") is None and layout.parse_step("step_x") is None
    assert layout.parse_step("step_12.bak") is None
    assert layout.parse_tmp("tmp_step_3") == 3 and layout.parse_tmp("step_3") is None
