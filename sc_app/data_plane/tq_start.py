"""TransferQueue's first start with its controller and its storage units starting at the same time.

``tq.init(conf)`` (transferqueue 0.1.11, ``transfer_queue/interface.py``) creates the controller actor, waits for
its ZMQ address, and only then creates the storage units and waits for theirs: two actor starts (a process each,
importing torch) one after the other. The units never read the controller's address
(``initialize_simple_storage`` uses the storage config only), so ``start`` asks Ray for the controller and then for
the units before it waits for either: the same actors, names, namespace, config and client as ``tq.init``, in the
time of the slower start instead of the sum — what an in-job restore that rebuilds the data plane waits for.

Invariants:
* the outcome is ``tq.init``'s: the controller named ``TransferQueueController`` in namespace ``transfer_queue``
  holds the merged config (TransferQueue's defaults, then ``conf``) with both ZMQ addresses; this process's
  TransferQueue client is built from it; the units are owned by this process (``tq.close`` stops them);
* a running TransferQueue is attached to, as ``tq.init`` does;
* anything this module does not reproduce exactly — another TransferQueue version, a backend other than
  ``SimpleStorage``, metrics on, a sampler given as an object — is ``tq.init(conf)`` itself.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

REPRODUCED_VERSION = "0.1.11"  # the TransferQueue whose interface.init this mirrors


def start(conf: Any) -> None:
    """Start TransferQueue (or attach to the running one) from ``conf``, an OmegaConf of overrides."""
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
    merged = interface._maybe_create_tq_storage(merged)  # creates the units, waits for their addresses
    merged.controller.zmq_info = interface.process_zmq_server_info(controller)  # started meanwhile
    import ray

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
    if not isinstance(merged.controller.sampler, str) or not hasattr(interface, merged.controller.sampler):
        return "a sampler that is not one of TransferQueue's by name"
    missing = [
        name
        for name in ("_init_from_existing", "_maybe_create_tq_storage", "_maybe_create_tq_client", "_TQ_CONTROLLER")
        if not hasattr(interface, name)
    ]
    return f"interface lacks {', '.join(missing)}" if missing else ""
