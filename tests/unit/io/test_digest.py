"""digest: the canonical encoding and the replay-index digest that ties the sidecar to the data plane."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from sc_app.io.digest import canonical_bytes, index_digest

PARTITION = "train"


def groups_fixture() -> dict[str, dict[str, Any]]:
    return {
        "p0": {"sample_ids": ["p0:0", "p0:1"], "prompt_index": 0, "version": 1},
        "p1": {"sample_ids": ["p1:0", "p1:1"], "prompt_index": 1, "version": 1},
        "p7": {"sample_ids": ["p7:0", "p7:1"], "prompt_index": 7, "version": 2},
    }


def test_canonical_bytes_is_sorted_compact_utf8() -> None:
    assert canonical_bytes({"b": 1, "a": [2, "é"]}) == '{"a":[2,"é"],"b":1}'.encode()
    assert canonical_bytes({"a": {"y": 1, "x": 2}}) == canonical_bytes({"a": {"x": 2, "y": 1}})


@pytest.mark.parametrize("bad", [{"a": 1.5}, {"a": [1, {"b": 0.0}]}, {1: "int key"}, {"a": {2: "x"}}])
def test_canonical_bytes_refuses_inexact_values(bad: Any) -> None:
    with pytest.raises(TypeError):
        canonical_bytes(bad)


def test_index_digest_pins_the_encoding() -> None:
    """Bundles written by earlier versions must keep verifying: the encoding is part of the on-disk format."""
    groups = groups_fixture()
    payload = {
        "partition": PARTITION,
        "group_size": 2,
        "groups": [[gid, groups[gid]] for gid in sorted(groups)],
    }
    want = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert index_digest(groups, partition=PARTITION, group_size=2) == want
    assert len(want) == 64


def test_index_digest_ignores_insertion_order() -> None:
    groups = groups_fixture()
    reordered = {gid: dict(reversed(list(groups[gid].items()))) for gid in reversed(list(groups))}
    assert list(reordered) != list(groups)
    d = index_digest(groups, partition=PARTITION, group_size=2)
    assert index_digest(reordered, partition=PARTITION, group_size=2) == d


Mutation = Callable[[dict[str, dict[str, Any]]], None]


def _rename_group(g: dict[str, dict[str, Any]]) -> None:
    g["p8"] = g.pop("p7")


MUTATIONS: dict[str, Mutation] = {
    "group id": _rename_group,
    "sample id": lambda g: g["p1"]["sample_ids"].__setitem__(1, "p1:9"),
    "sample id order": lambda g: g["p1"]["sample_ids"].reverse(),
    "prompt index": lambda g: g["p1"].__setitem__("prompt_index", 2),
    "version": lambda g: g["p0"].__setitem__("version", 2),
    "group removed": lambda g: g.pop("p0"),
    "group added": lambda g: g.__setitem__("p9", {"sample_ids": ["p9:0", "p9:1"], "prompt_index": 9, "version": 1}),
}


@pytest.mark.parametrize("what", sorted(MUTATIONS))
def test_index_digest_changes_with_any_field(what: str) -> None:
    groups = groups_fixture()
    base = index_digest(groups, partition=PARTITION, group_size=2)
    changed = copy.deepcopy(groups)
    MUTATIONS[what](changed)
    assert index_digest(changed, partition=PARTITION, group_size=2) != base


def test_index_digest_covers_partition_and_group_size() -> None:
    groups = groups_fixture()
    base = index_digest(groups, partition=PARTITION, group_size=2)
    assert index_digest(groups, partition="eval", group_size=2) != base
    assert index_digest(groups, partition=PARTITION, group_size=3) != base
    assert index_digest({}, partition=PARTITION, group_size=2) != base
