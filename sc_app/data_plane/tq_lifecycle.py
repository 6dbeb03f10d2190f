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
* either way the units are placed by TransferQueue's rule over the nodes that can host one, those where the job
  leaves a CPU free first (``tq_placement``);
* a start waits within the caller's bound (``sc_app.waits``), though TransferQueue's own waits have none: a unit
  pinned to a node whose CPUs are all taken would otherwise hold the set-up, or a warm restore, for ever.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from importlib import resources
from typing import Any

from sc_app.data_plane.tq_placement import StorageUnitNodeGone, units_on_capable_nodes
from sc_app.waits import Bound, in_thread

log = logging.getLogger(__name__)

REPRODUCED_VERSION = "0.1.11"  # the TransferQueue whose interface.init this mirrors
_made_units = False  # this process's storage units were made by ``start`` (no SSD offload): ``stop`` kills them


UNIT_NAME = "TransferQueueStorageUnit#"  # + k: the name TransferQueue gives its k-th storage unit


def start(conf: Any, bound: Bound | None = None, held: Mapping[str, float] | None = None) -> None:
    """Start TransferQueue (or attach to the running one) from ``conf``, an OmegaConf of overrides, within
    ``bound`` (default: the caller's, ``sc_app.waits``). TransferQueue's own waits for its actors have no timeout;
    here a start that has not finished when the bound ends is ``ProcessHung`` naming the units' nodes (a stop:
    ``StopCut``), and the units it asked for are killed, so that a later start can use their names. ``held``: the
    CPUs per node the job's other actors are expected to hold (``tq_placement.unit_nodes``)."""
    import ray

    pinned: list[str] = []

    def run() -> None:
        with units_on_capable_nodes(pinned, held):
            _start(conf)

    try:
        in_thread(
            run, what="TransferQueue's start", kind="data_plane.storage", bound=bound, give_up=lambda: _abandon(pinned)
        )
    except ray.exceptions.ActorUnschedulableError as value:
        first = str(value).strip().splitlines()[0] if str(value).strip() else type(value).__name__
        raise StorageUnitNodeGone(
            f"a TransferQueue storage unit could not start on the node it was pinned to ({first}): the node left "
            "the cluster meanwhile; rerun (the units are placed on the nodes alive then)"
        ) from None


def _abandon(pinned: list[str]) -> str:
    """Kill what a start that is given up on asked for: its storage units (by name: TransferQueue keeps their handles
    to itself until every one answered) and its controller. Returns the units that had not started, in words."""
    import ray
    from ray._private import state

    alive = {a.get("Name") for a in state.actors(actor_state_name="ALIVE").values()}
    waiting = [f"#{k} on node {node[:8]}" for k, node in enumerate(pinned) if f"{UNIT_NAME}{k}" not in alive]
    for k in range(len(pinned)):
        with contextlib.suppress(ValueError):  # never created, or gone
            ray.kill(ray.get_actor(f"{UNIT_NAME}{k}"))
    stop()
    named = ", ".join(waiting) or "not placed yet"
    return f"TransferQueue's storage unit(s) {named} (a unit waits for a free CPU on the node it is pinned to)"


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
