"""The streamed data plane is checked in full — ``metadata.json`` and every part header — by the validators the restore
(``iter_groups``) uses: every defect verification names is one the restore refuses, before a byte becomes a tensor.

Each case edits one JSON file of a good bundle's data plane and recomputes the manifest's hashes (as someone without
the HMAC key could): only parsing can catch it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sc_app.checkpoint import plan_resume, verify_bundle
from sc_app.data_plane.streamed_format import StreamedFormatError, iter_groups
from tests.support.bundles import make_bundle, reseal
from tests.support.opens import opened_files, outside

Edit = Callable[[dict[str, Any]], Any]


def seg(h: dict[str, Any], i: int = 0) -> dict[str, Any]:
    return h["segments"][i]


def field(h: dict[str, Any], name: str = "tokens") -> dict[str, Any]:
    return seg(h)["fields"][name]


# part-00-00000.json edits → words the problem must contain
HEADER: dict[str, tuple[Edit, str]] = {
    "bin climbs out": (lambda h: h.update(bin="../../../etc/passwd"), "names only its own part-00-00000.bin"),
    "bin absolute": (lambda h: h.update(bin="/etc/passwd"), "names only its own"),
    "bin of another part": (lambda h: h.update(bin="part-00-00001.bin"), "names only its own"),
    "bytes not the bin's size": (lambda h: h.update(bytes=h["bytes"] + 1), "holds"),
    "unknown dtype": (lambda h: field(h).update(dtype="object"), "unknown dtype 'object'"),
    "dtype a torch attribute": (lambda h: field(h).update(dtype="Tensor"), "unknown dtype 'Tensor'"),
    "shape disagrees with nbytes": (lambda h: field(h).update(nbytes=field(h)["nbytes"] + 8), "nbytes says"),
    "shape disagrees with rows": (lambda h: field(h).update(shape=[3, 4], nbytes=96), "segment's 2 rows"),
    "bytes outside the bin": (lambda h: field(h).update(offset=h["bytes"] // 64 * 64 + 64), "outside the part file"),
    "offset not aligned": (lambda h: field(h).update(offset=field(h)["offset"] + 1), "not aligned"),
    "fields overlap": (lambda h: field(h, "logprobs").update(offset=field(h)["offset"]), "overlap"),
    "jagged offsets decrease": (lambda h: field(h, "ragged").update(offsets=[0, 2, 1]), "offsets"),
    "jagged offsets of other rows": (lambda h: field(h, "ragged").update(offsets=[0, 3]), "offsets"),
    "id of another group": (lambda h: seg(h)["ids"].__setitem__(0, "other:0"), "does not belong to the group"),
    "id twice": (lambda h: seg(h)["ids"].__setitem__(1, seg(h)["ids"][0]), "appears twice"),
    "tags per row": (lambda h: seg(h).update(tags=seg(h)["tags"][:1]), "1 tag records for 2 rows"),
    "tag value a mapping": (lambda h: seg(h)["tags"][0].update(group={"deep": 1}), "tags"),
    "no fields": (lambda h: seg(h).update(fields={}), "fields"),
    "no ids": (lambda h: seg(h).update(ids=[], tags=[]), "ids"),
    "negative offset": (lambda h: field(h).update(offset=-64), "offset"),
    "offset a boolean": (lambda h: field(h).update(offset=True), "offset"),
    "offset a float": (lambda h: field(h).update(offset=64.0), "offset"),
    "too many dimensions": (lambda h: field(h).update(shape=[2] + [1] * 40), "shape"),
    "missing key": (lambda h: h.pop("segments"), "segments"),
    "extra key": (lambda h: h.update(extra=1), "extra"),
    "other format": (lambda h: h.update(format="sc-app/streamed-v0"), "format"),
    "format of another version": (lambda h: h.update(format="sc-app/streamed-v1"), "metadata.json says"),
    "group stored in two parts": (None, "stored twice"),  # part-00-00001's first segment says it is part-00-00000's
}

# metadata.json edits
METADATA: dict[str, tuple[Edit, str]] = {
    "part name climbs out": (lambda m: m["parts"].__setitem__(0, "../../step_2/data_plane/part-00-00000"), "parts"),
    "part name absolute": (lambda m: m["parts"].__setitem__(0, "/etc/passwd"), "parts"),
    "part twice": (lambda m: m.update(parts=[m["parts"][0]] * 2), "twice"),
    "rows off": (lambda m: m.update(rows=m["rows"] + 1), "metadata.json says"),
    "bytes off": (lambda m: m.update(bytes=m["bytes"] - 1), "metadata.json says"),
    "rows a string": (lambda m: m.update(rows="6"), "rows"),
    "user_metadata a list": (lambda m: m.update(user_metadata=[1]), "user_metadata"),
    "extra key": (lambda m: m.update(extra=1), "extra"),
    "partition empty": (lambda m: m.update(partition=""), "partition"),
    # v2: one stream of parts per storage unit (the bundles here have one)
    "streams miss a part": (lambda m: m["streams"][0]["parts"].pop(), "streams' parts"),
    "part in no stream": (lambda m: m["streams"][0].update(parts=[]), "streams' parts"),
    "stream rows off": (lambda m: m["streams"][0].update(rows=m["rows"] + 1), "streams add up to"),
    "segments off": (lambda m: m.update(segments=m["segments"] + 1), "streams add up to"),
    "stream and total rows off together": (
        lambda m: (m.update(rows=m["rows"] + 1), m["streams"][0].update(rows=m["rows"])),
        "metadata.json says",
    ),
    "v1 with streams": (lambda m: m.update(format="sc-app/streamed-v1"), "no segments or streams"),
    "v2 without streams": (lambda m: m.pop("streams"), "needs segments and streams"),
    "v2 part named as v1": (
        lambda m: (m["parts"].__setitem__(0, "part-00000"), m["streams"][0]["parts"].__setitem__(0, "part-00000")),
        "is not one of",
    ),
}


def _edit_json(path: Path, edit: Edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _damaged(tmp_path: Path, rel: str, edit: Edit | None) -> Path:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    dp = bundle / "data_plane"
    if edit is None:  # part-00-00001's first segment claims part-00-00000's first group and sample ids
        first = seg(json.loads((dp / "part-00-00000.json").read_text()))
        _edit_json(dp / "part-00-00001.json", lambda h: seg(h).update(group=first["group"], ids=first["ids"]))
    else:
        _edit_json(bundle / rel, edit)
    reseal(bundle)
    return bundle


def _assert_refused_by_verify_and_restore(tmp_path: Path, bundle: Path, needle: str) -> None:
    with opened_files() as seen:
        report = verify_bundle(bundle)
    assert any(needle in p and str(bundle / "data_plane") in p for p in report.problems), report.problems
    assert outside(seen, bundle) == [], "verification opened a file outside the bundle"
    with opened_files() as seen, pytest.raises(StreamedFormatError):
        for _ in iter_groups(bundle / "data_plane"):
            pass
    assert outside(seen, bundle) == [], "the restore opened a file outside the bundle"
    plan = plan_resume(tmp_path)
    assert plan.decision == "resume" and plan.step == 2, "fallback goes on to the older good bundle"


@pytest.mark.parametrize("case", list(HEADER))
def test_every_part_header_is_checked_as_the_restore_checks_it(tmp_path: Path, case: str) -> None:
    edit, needle = HEADER[case]
    bundle = _damaged(tmp_path, "data_plane/part-00-00000.json", edit)
    _assert_refused_by_verify_and_restore(tmp_path, bundle, needle)


@pytest.mark.parametrize("case", list(METADATA))
def test_metadata_json_is_checked_as_the_restore_checks_it(tmp_path: Path, case: str) -> None:
    edit, needle = METADATA[case]
    bundle = _damaged(tmp_path, "data_plane/metadata.json", edit)
    _assert_refused_by_verify_and_restore(tmp_path, bundle, needle)


def test_a_good_data_plane_restores_every_group(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    groups = list(iter_groups(bundle / "data_plane"))
    assert [g.group for g in groups] == ["p20", "p21", "p22"]
    assert all(g.data["ragged"].is_nested for g in groups)


@pytest.mark.parametrize("rel", ["data_plane/part-00-00001.json", "data_plane/part-00-00001.bin"])
def test_a_part_metadata_json_names_must_exist(tmp_path: Path, rel: str) -> None:
    make_bundle(tmp_path, 2)
    bundle = make_bundle(tmp_path, 4)
    (bundle / rel).unlink()
    reseal(bundle)  # a consistent manifest of a data plane that lacks a part
    report = verify_bundle(bundle)
    assert any(str(bundle / rel) in p and "missing" in p for p in report.problems), report.problems
    with pytest.raises(StreamedFormatError, match="missing"):
        list(iter_groups(bundle / "data_plane"))


def test_a_file_metadata_json_does_not_name_is_a_problem(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path, 2)
    (bundle / "data_plane" / "part-00-00009.bin").write_bytes(b"stray")
    reseal(bundle)
    report = verify_bundle(bundle)
    assert any("part-00-00009.bin" in p and "not a file of the snapshot" in p for p in report.problems)
