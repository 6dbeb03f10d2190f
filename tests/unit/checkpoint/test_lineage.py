"""checkpoint.lineage: written once, kept by every retry, adopted from the bundles when the file went missing; and
what the lineage means to the bundles: one whose manifest records another lineage than the directory's is a
problem — never resumed, never pruned, never counted towards ``keep``, never the anchor; a manifest without
``lineage`` (written before lineages existed) belongs; callers that pass no lineage behave as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from sc_app.checkpoint import plan_resume, prune, verify_bundle
from sc_app.checkpoint.lineage import LINEAGE_FILE, LineageError, ensure_lineage, read_lineage
from tests.support.bundles import make_bundle, tree


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


# ---------------------------------------------------------------------------------------------- bundles
OURS, THEIRS = "lin-ours", "lin-theirs"


@pytest.mark.parametrize(
    ("recorded", "expected", "ok"),
    [
        (OURS, OURS, True),
        (None, OURS, True),  # written before lineages existed
        (THEIRS, None, True),  # caller does not check lineages
        (THEIRS, OURS, False),
    ],
)
def test_verify_checks_the_recorded_lineage(
    tmp_path: Path, recorded: str | None, expected: str | None, ok: bool
) -> None:
    bundle = make_bundle(tmp_path, 2, lineage=recorded)
    for deep in (True, False):
        report = verify_bundle(bundle, deep=deep, expected_lineage=expected)
        assert report.ok is ok, report.problems
    if not ok:
        assert f"belongs to lineage {THEIRS}, this directory is lineage {OURS}" in report.problems[0]
        assert str(bundle / "manifest.json") in report.problems[0]


def test_a_foreign_bundle_is_never_resumed(tmp_path: Path) -> None:
    make_bundle(tmp_path, 4, lineage=OURS)
    make_bundle(tmp_path, 90, lineage=THEIRS)  # copied in, with a higher step
    strict = plan_resume(tmp_path, on_corrupt="strict", expected_lineage=OURS, tidy=False)
    assert strict.decision == "refuse" and "belongs to lineage" in strict.reason
    plan = plan_resume(tmp_path, expected_lineage=OURS)
    assert plan.decision == "resume" and plan.step == 4
    assert [q.split(" ")[0] for q in plan.quarantined] == ["step_90"], "moved aside, never deleted"
    assert plan_resume(tmp_path, expected_lineage=THEIRS).decision == "refuse", "only foreign bundles left"


def test_prune_neither_deletes_nor_counts_foreign_bundles(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        make_bundle(tmp_path, step, lineage=OURS)
    make_bundle(tmp_path, 8, lineage=None)  # pre-lineage: ours
    foreign = {s: tree(make_bundle(tmp_path, s, lineage=THEIRS)) for s in (3, 100)}
    removed = prune(tmp_path, keep=2, expected_lineage=OURS)
    assert sorted(removed) == ["step_2", "step_4"], "step_100 is not the anchor and step_3 is not counted"
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_100", "step_3", "step_6", "step_8"]
    assert {s: tree(tmp_path / f"step_{s}") for s in foreign} == foreign


def test_without_a_lineage_prune_behaves_as_before(tmp_path: Path) -> None:
    for step in (2, 4):
        make_bundle(tmp_path, step, lineage=OURS)
    make_bundle(tmp_path, 100, lineage=THEIRS)
    assert sorted(prune(tmp_path, keep=2)) == ["step_2"], "no lineage given: every bundle counts, as today"
