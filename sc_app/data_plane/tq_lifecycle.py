"""TransferQueue started and stopped by the process that owns it: its controller and storage units start at the
same time, and stop without the units' graceful shutdown.

``tq.init(conf)`` (transferqueue 0.1.11, ``transfer_queue/interface.py``) creates the controller actor, waits for
its ZMQ address, and only then creates the storage units and waits for theirs: two actor starts (a process each,
importing torch) one after the other. The units never read the controller's address
(``initialize_simple_storage`` uses the storage config only), so ``start`` asks Ray for the controller and then for
the units before it waits for either: the same actors, names, namespace, config and client as ``tq.init``, in the
time of the slower start instead of the sum — what an in-job restore that rebuilds the data plane waits for.

``stop`` kills the storage units instead of asking them to shut down first, then closes as ``tq.close`` does (the
client, then the controller). A unit's graceful shutdown only releases what its own process holds (TransferQueue
waits up to a second for its idle threads to see it) — and the SSD offload's files, which sc-app never enables;
every stop sc-app makes (a run's end, a teardown, a warm restore's rebuild of a data plane something died in)
ends those processes anyway: ~1 s less each.

Invariants:
* the outcome of ``start`` is ``tq.init``'s: the controller named ``TransferQueueController`` in namespace
  ``transfer_queue`` holds the merged config (TransferQueue's defaults, then ``conf``) with both ZMQ addresses; this
  process's TransferQueue client is built from it; the units are owned by this process (``stop`` ends them);
* a running TransferQueue is attached to, as ``tq.init`` does;
* anything ``start`` does not reproduce exactly — another TransferQueue version, a backend other than
  ``SimpleStorage``, metrics or SSD offload on, a sampler given as an object — is ``tq.init(conf)`` itself, and
  ``stop`` leaves the units ``tq.init`` made to ``tq.close``'s graceful shutdown;
* either way the units are placed as TransferQueue places them — pinned (hard node affinity) round robin over the
  alive nodes, sorted by id, that have ``required_node_resource`` — except that a node that can never host one
  (fewer CPUs than a unit asks Ray for: a head started with ``num-cpus: 0``, as Ray advises for large clusters) is
  not one of them (``unit_nodes``). TransferQueue would pin a unit there and its start fail with Ray's
  ``ActorUnschedulableError``; with no node able to host a unit the start is ``StorageUnitsUnplaceable``, one line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources
from typing import Any

from sc_app.config.app import TQ_STORAGE_UNIT_CPUS

log = logging.getLogger(__name__)

REPRODUCED_VERSION = "0.1.11"  # the TransferQueue whose interface.init this mirrors
_made_units = False  # this process's storage units were made by ``start`` (no SSD offload): ``stop`` kills them


class StorageUnitsUnplaceable(RuntimeError):
    """No alive Ray node can host a TransferQueue storage unit; the message is the one line to print."""


class StorageUnitNodeGone(RuntimeError):
    """A storage unit's node left between its choice and the unit's start; the one line to print (a rerun places
    the units on the nodes alive then)."""


def unit_nodes(nodes: list[Mapping[str, Any]], count: int, resource: str | None) -> list[str]:
    """The node id each of ``count`` storage units is pinned to: round robin over the alive nodes (``ray.nodes()``
    entries), sorted by id, that have ``resource`` (when given) and at least the CPUs a unit asks for."""
    eligible = [n for n in nodes if n.get("Alive", False) and (resource is None or n["Resources"].get(resource, 0) > 0)]
    capable = sorted(n["NodeID"] for n in eligible if n["Resources"].get("CPU", 0) >= TQ_STORAGE_UNIT_CPUS)
    if not capable:
        which = f"with the resource {resource} (data_plane.storage_node_resource)" if resource else "alive"
        offered = ", ".join(f"{n['NodeID'][:8]}: {n['Resources'].get('CPU', 0):g}" for n in eligible) or "none"
        raise StorageUnitsUnplaceable(
            f"no Ray node can host a TransferQueue storage unit: each asks for {TQ_STORAGE_UNIT_CPUS:g} CPU and the "
            f"nodes {which} offer fewer (CPUs per node: {offered}); give such a node CPUs (`ray start --num-cpus`), or "
            "point data_plane.storage_node_resource at a resource of nodes that have some"
        )
    return [capable[i % len(capable)] for i in range(count)]


@contextmanager
def _units_on_capable_nodes() -> Iterator[None]:
    """TransferQueue's unit placement, for the duration of a start, over the nodes that can host a unit."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    name = "get_node_round_robin_scheduling_strategies"
    original = getattr(bootstrap, name, None)
    if original is None:  # another TransferQueue: its own placement
        yield
        return

    def strategies(num_actors: int, required_node_resource: str | None = None) -> list[Any]:
        pinned = unit_nodes(ray.nodes(), num_actors, required_node_resource)
        return [NodeAffinitySchedulingStrategy(node_id=node, soft=False) for node in pinned]

    setattr(bootstrap, name, strategies)
    try:
        yield
    finally:
        setattr(bootstrap, name, original)


def start(conf: Any) -> None:
    """Start TransferQueue (or attach to the running one) from ``conf``, an OmegaConf of overrides."""
    import ray

    try:
        with _units_on_capable_nodes():
            _start(conf)
    except ray.exceptions.ActorUnschedulableError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StorageUnitNodeGone(
            f"a TransferQueue storage unit could not start on the node it was pinned to ({first}): the node left "
            "the cluster meanwhile; rerun (the units are placed on the nodes alive then)"
        ) from None


def _start(conf: Any) -> None:
    global _made_units
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from transfer_queue import interface

    if interface._init_from_existing():
        return
    merged = OmegaConf.merge(
        OmegaConf.create({}, flags={"allow_objects": True}),
        OmegaConf.load(resources.files("transfer_queue") / "config.yaml"),
        conf,
    )
    why_not = _not_reproduced(tq, merged)
    if why_not:
        log.debug("TransferQueue started by tq.init: %s", why_not)
        tq.init(conf)
        return
    sampler = getattr(interface, merged.controller.sampler)()
    try:
        controller = interface.TransferQueueController.options(
            name="TransferQueueController", namespace="transfer_queue"
        ).remote(sampler=sampler, polling_mode=merged.controller.polling_mode)
    except ValueError:  # another process created it meanwhile: attach, as tq.init does
        interface._init_from_existing()
        return
    interface._TQ_CONTROLLER = controller
    _made_units = True
    merged = interface._maybe_create_tq_storage(merged)  # creates the units, waits for their addresses
    merged.controller.zmq_info = interface.process_zmq_server_info(controller)  # started meanwhile
    ray.get(controller.store_config.remote(merged))
    interface._maybe_create_tq_client(merged)


def _not_reproduced(tq: Any, merged: Any) -> str:
    """Why ``start`` must leave this start to ``tq.init`` ('' when it reproduces it)."""
    from transfer_queue import interface

    version = getattr(tq, "__version__", None)
    if version != REPRODUCED_VERSION:
        return f"TransferQueue {version} (this start mirrors {REPRODUCED_VERSION})"
    if merged.backend.storage_backend != "SimpleStorage":
        return f"backend {merged.backend.storage_backend}"
    if merged.get("metrics", {}).get("enabled", False):
        return "metrics enabled"
    if merged.backend.SimpleStorage.get("ssd_offload", {}).get("enabled", False):
        return "SSD offload enabled (its files are removed by the units' graceful shutdown)"
    if not isinstance(merged.controller.sampler, str) or not hasattr(interface, merged.controller.sampler):
        return "a sampler that is not one of TransferQueue's by name"
    missing = [
        name
        for name in ("_init_from_existing", "_maybe_create_tq_storage", "_maybe_create_tq_client", "_TQ_CONTROLLER")
        if not hasattr(interface, name)
    ]
    return f"interface lacks {', '.join(missing)}" if missing else ""


def stop() -> None:
    """Close this process's TransferQueue: storage units that ``start`` made killed (not asked to shut down: the
    module docstring), then ``tq.close`` (client closed, controller killed; units someone else made shut down
    gracefully); best effort — what is already dead is skipped."""
    import ray
    import transfer_queue as tq
    from transfer_queue import interface

    global _made_units
    owned = getattr(interface, "_TQ_STORAGE", None) or {}
    if _made_units and set(owned) == {"SimpleStorage"}:
        for unit in owned["SimpleStorage"].values():
            try:
                ray.kill(unit)
            except Exception:  # already dead
                log.debug("killing a storage unit failed", exc_info=True)
        interface._TQ_STORAGE = None
    _made_units = False
    try:
        tq.close()
    except Exception:  # best effort at shutdown
        log.debug("tq.close failed", exc_info=True)
