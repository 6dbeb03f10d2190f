"""checkpoint.lineage: written once, kept by every retry, adopted from the bundles when the file went missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint.lineage import LINEAGE_FILE, LineageError, ensure_lineage, read_lineage


def test_written_once_and_kept(tmp_path: Path) -> None:
    assert read_lineage(tmp_path) is None
    first = ensure_lineage(tmp_path)
    assert ensure_lineage(tmp_path) == first == read_lineage(tmp_path)
    assert ensure_lineage(tmp_path, adopt="other") == first, "an existing lineage is never rewritten"


def test_adopts_the_lineage_its_bundles_record(tmp_path: Path) -> None:
    assert ensure_lineage(tmp_path, adopt="from-the-newest-bundle") == "from-the-newest-bundle"


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"lineage": 3}', b'{"lineage": ""}', b"\xff"])
def test_a_malformed_lineage_is_one_clear_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / LINEAGE_FILE).write_bytes(content)
    with pytest.raises(LineageError) as info:
        read_lineage(tmp_path)
    assert str(tmp_path / LINEAGE_FILE) in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(LineageError):
        ensure_lineage(tmp_path)
    assert (tmp_path / LINEAGE_FILE).read_bytes() == content
