"""DataPlaneGuard: one tiny named Ray actor that every data-plane client reports to.

It closes the seed's admitted gap ("the guard inside the adapter could not see it — it only knows about its own
client"): touches and the restore decision are recorded in one place all processes share. A Ray actor runs its
methods one at a time, so check-and-set here is atomic across processes.

State machine: OPEN (untouched) -> RESTORING -> SEALED, or OPEN -> touched -> SEALED; ``reopen`` (a warm in-job
restore, once the data plane is empty or new) -> OPEN.
* ``begin_restore`` succeeds only when nothing has touched the data plane and it is not sealed.
* ``sealed()`` is None until ``seal``; a connect-only client refuses to exist while it is (``RestoreOrderError``).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from sc_app.data_plane.client import RestoreOrderError

GUARD_NAME = "sc_app_data_plane_guard"
_KEPT: dict[str, list[Any]] = {}  # namespace → the guard handles this process created or looked up to create


@ray.remote(num_cpus=0, max_restarts=0)
class DataPlaneGuard:
    def __init__(self) -> None:
        self._touches: list[dict[str, Any]] = []
        self._restoring: str | None = None
        self._sealed: dict[str, Any] | None = None

    def touch(self, client_id: str, op: str) -> None:
        if len(self._touches) < 64:
            self._touches.append({"client": client_id, "op": op, "at": time.time()})

    def begin_restore(self, client_id: str) -> tuple[bool, str]:
        if self._sealed is not None:
            return False, f"the restore decision was already sealed by {self._sealed.get('by')}"
        if self._touches:
            t = self._touches[0]
            return False, f"client {t['client']} already did '{t['op']}' on the data plane"
        if self._restoring is not None and self._restoring != client_id:
            return False, f"client {self._restoring} is already restoring"
        self._restoring = client_id
        return True, ""

    def seal(self, info: dict[str, Any]) -> None:
        self._sealed = dict(info)
        self._restoring = None

    def reopen(self) -> None:
        """Back to OPEN for a data plane emptied or started again in-job (a warm in-job restore): every client that
        touched the old one is gone or detached, and a new connect-only client needs the new seal."""
        self._touches, self._restoring, self._sealed = [], None, None

    def sealed(self) -> dict[str, Any] | None:
        return self._sealed

    def touches(self) -> list[dict[str, Any]]:
        return list(self._touches)


def get_guard(namespace: str, *, create: bool) -> Any:
    """The guard actor handle; ``create=True`` creates it when absent (bootstrap side only)."""
    if create:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        handle = DataPlaneGuard.options(  # on the creator's node (the driver's): a lost worker node never takes it
            name=GUARD_NAME, namespace=namespace, get_if_exists=True, scheduling_strategy=here
        ).remote()
        # Ray ends a non-detached actor once its creator's handles are gone, named or not: a warm in-job restore
        # replaces the bootstrap client that created it, so this process keeps the handles it got here
        _KEPT.setdefault(namespace, []).append(handle)  # one per bootstrap client: a few per attempt
        return handle
    try:
        return ray.get_actor(GUARD_NAME, namespace=namespace)
    except ValueError:
        raise RestoreOrderError(
            f"no data-plane guard in Ray namespace '{namespace}': a connect-only client was built before any "
            "bootstrap client (setup_single_controller) ran"
        ) from None
