"""Where TransferQueue's storage units go: TransferQueue's own placement, less the nodes that can never host one.

TransferQueue (0.1.11, ``transfer_queue/utils/common.py``) pins each storage unit to one node (hard node affinity),
round robin over the alive nodes, sorted by id, that have ``required_node_resource`` when it is set. A node with
fewer CPUs than a unit asks Ray for — a head started with ``num-cpus: 0``, as Ray advises for large clusters — can
never host one: the unit's start fails with Ray's ``ActorUnschedulableError``. ``unit_nodes`` is that placement over
the nodes that can (none: ``StorageUnitsUnplaceable``), the nodes where the job's other actors are expected to leave
a CPU free taken first (a unit pinned to a node whose CPUs they all hold waits until the start's deadline);
``units_on_capable_nodes`` has TransferQueue use it for the duration of a start. Pure except that context manager
(Ray and TransferQueue imported inside it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sc_app.config.embedded import TQ_STORAGE_UNIT_CPUS

PLACEMENT_FN = "get_node_round_robin_scheduling_strategies"  # the name transfer_queue's SimpleStorage start calls


class StorageUnitsUnplaceable(RuntimeError):
    """No alive Ray node can host a TransferQueue storage unit; the message is the one line to print."""


class StorageUnitNodeGone(RuntimeError):
    """A storage unit's node left between its choice and the unit's start; the one line to print (a rerun places
    the units on the nodes alive then)."""


def unit_nodes(
    nodes: list[Mapping[str, Any]], count: int, resource: str | None, held: Mapping[str, float] | None = None
) -> list[str]:
    """The node id each of ``count`` storage units is pinned to: round robin over the alive nodes (``ray.nodes()``
    entries), sorted by id, that have ``resource`` (when given) and at least the CPUs a unit asks for. ``held``
    (node id → CPUs the job's other actors are expected to hold there): the units go first to the nodes with a CPU
    to spare for each, round robin while they have one; the rest (none has room) round robin over all of them."""
    eligible = [n for n in nodes if n.get("Alive", False) and (resource is None or n["Resources"].get(resource, 0) > 0)]
    cpus = {n["NodeID"]: float(n["Resources"].get("CPU", 0)) for n in eligible}
    capable = sorted(node for node, have in cpus.items() if have >= TQ_STORAGE_UNIT_CPUS)
    if not capable:
        which = f"with the resource {resource} (data_plane.storage_node_resource)" if resource else "alive"
        offered = ", ".join(f"{n['NodeID'][:8]}: {n['Resources'].get('CPU', 0):g}" for n in eligible) or "none"
        raise StorageUnitsUnplaceable(
            f"no Ray node can host a TransferQueue storage unit: each asks for {TQ_STORAGE_UNIT_CPUS:g} CPU and the "
            f"nodes {which} offer fewer (CPUs per node: {offered}); give such a node CPUs (`ray start --num-cpus`), or "
            "point data_plane.storage_node_resource at a resource of nodes that have some"
        )
    spare = {node: cpus[node] - (held or {}).get(node, 0.0) for node in capable}
    pinned: list[str] = []
    while len(pinned) < count:
        roomy = [node for node in capable if spare[node] >= TQ_STORAGE_UNIT_CPUS]
        for node in roomy[: count - len(pinned)]:
            pinned.append(node)
            spare[node] -= TQ_STORAGE_UNIT_CPUS
        if not roomy:
            break
    return pinned + [capable[i % len(capable)] for i in range(count - len(pinned))]


@contextmanager
def units_on_capable_nodes(pinned: list[str] | None = None, held: Mapping[str, float] | None = None) -> Iterator[None]:
    """TransferQueue's unit placement is ``unit_nodes`` (given ``held``) while inside; ``pinned`` gets the chosen
    node ids."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    original = getattr(bootstrap, PLACEMENT_FN, None)
    original = getattr(original, "transfer_queues", original)  # a start given up on may not have put it back yet
    if original is None:  # another TransferQueue: its own placement
        yield
        return

    def strategies(num_actors: int, required_node_resource: str | None = None) -> list[Any]:
        nodes = unit_nodes(ray.nodes(), num_actors, required_node_resource, held)
        if pinned is not None:
            pinned[:] = nodes
        return [NodeAffinitySchedulingStrategy(node_id=node, soft=False) for node in nodes]

    strategies.transfer_queues = original  # type: ignore[attr-defined]
    setattr(bootstrap, PLACEMENT_FN, strategies)
    try:
        yield
    finally:
        if getattr(bootstrap, PLACEMENT_FN) is strategies:  # a start given up on ends after the next one began
            setattr(bootstrap, PLACEMENT_FN, original)
