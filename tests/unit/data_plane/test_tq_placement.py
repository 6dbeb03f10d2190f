"""``tq_placement.unit_nodes``: TransferQueue's storage-unit placement (pinned round robin over the alive nodes,
sorted by id, with the required resource), less the nodes that can never host a unit (fewer CPUs than it asks for:
a Ray head started with ``num-cpus: 0``); none left is one line naming the nodes and what to do."""

from __future__ import annotations

from typing import Any

import pytest

from sc_app.data_plane.tq_placement import StorageUnitsUnplaceable, unit_nodes


def node(node_id: str, cpus: float, alive: bool = True, **resources: float) -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": alive, "Resources": {"CPU": cpus, **resources} if cpus else dict(resources)}


def test_round_robin_over_the_nodes_that_can_host_a_unit_sorted_by_id_while_they_have_room() -> None:
    nodes = [node("c", 4), node("a", 0), node("b", 2), node("d", 8, alive=False)]
    assert unit_nodes(nodes, 5, None) == ["b", "c", "b", "c", "c"]  # "a" offers no CPU, "d" is dead, "b" is full
    assert unit_nodes(nodes, 8, None) == ["b", "c", "b", "c", "c", "c", "b", "c"], "no room left: round robin"


def test_the_nodes_the_jobs_other_actors_fill_get_a_unit_last() -> None:
    """A GPU node whose CPUs the trainer ranks hold gets no unit while the head has a CPU to spare; with none to
    spare anywhere, TransferQueue's round robin (the start's deadline then names the unit that waits)."""
    nodes = [node("gpu", 8, GPU=8), node("head", 4)]
    assert unit_nodes(nodes, 2, None, held={"gpu": 8, "head": 2}) == ["head", "head"]
    assert unit_nodes(nodes, 3, None, held={"gpu": 8, "head": 2}) == ["head", "head", "gpu"]
    assert unit_nodes(nodes, 2, None, held={"gpu": 8, "head": 4}) == ["gpu", "head"]


def test_the_required_resource_narrows_the_nodes_first() -> None:
    nodes = [node("a", 4), node("b", 2, tq=1), node("c", 0, tq=1), node("d", 0.5, tq=1)]
    assert unit_nodes(nodes, 2, "tq") == ["b", "b"]


@pytest.mark.parametrize(
    ("resource", "named"),
    [(None, "the nodes alive offer fewer (CPUs per node: a: 0, b: 0.5)"), ("tq", "resource tq")],
)
def test_no_node_that_can_host_a_unit_is_one_line(resource: str | None, named: str) -> None:
    nodes = [node("a", 0, tq=1), node("b", 0.5), node("c", 4, alive=False, tq=1)]
    with pytest.raises(StorageUnitsUnplaceable) as raised:
        unit_nodes(nodes, 1, resource)
    line = str(raised.value)
    assert "\n" not in line and named in line and "storage_node_resource" in line, line


def test_a_start_given_up_on_never_leaves_its_placement_behind() -> None:
    """Two starts overlap when the first is given up on (its thread still blocked) and a second begins: whichever
    ends last, TransferQueue's own placement function is the one left in place."""
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    from sc_app.data_plane.tq_placement import PLACEMENT_FN, units_on_capable_nodes

    theirs = getattr(bootstrap, PLACEMENT_FN)
    first, second = units_on_capable_nodes(), units_on_capable_nodes()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # the given-up start's thread ends while the second start runs
    assert getattr(bootstrap, PLACEMENT_FN) is not theirs
    second.__exit__(None, None, None)
    assert getattr(bootstrap, PLACEMENT_FN) is theirs
    first, second = units_on_capable_nodes(), units_on_capable_nodes()
    first.__enter__()
    second.__enter__()
    second.__exit__(None, None, None)
    first.__exit__(None, None, None)
    assert getattr(bootstrap, PLACEMENT_FN) is theirs
