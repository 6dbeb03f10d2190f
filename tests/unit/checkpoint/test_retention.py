"""checkpoint.retention: prune keeps the newest N, pins and anything it cannot verify."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint import prune
from tests.support.bundles import make_bundle, truncate


def test_prune_keeps_newest_and_never_the_newest_verified(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        make_bundle(tmp_path, step)
    removed = prune(tmp_path, keep=2)
    assert sorted(removed) == ["step_2", "step_4"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_6", "step_8"]
    truncate(tmp_path / "step_8" / "policy/model.pt")  # newest no longer verifies: step_6 is the anchor
    assert prune(tmp_path, keep=1) == []
    assert (tmp_path / "step_6").exists() and (tmp_path / "step_8").exists()
    with pytest.raises(ValueError):
        prune(tmp_path, keep=0)
