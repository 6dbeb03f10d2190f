"""TransferQueue helpers for in-process integration tests (with the ``local_ray`` fixture)."""

from __future__ import annotations

import time


def close_transferqueue() -> None:
    """Close the running TransferQueue and wait until its controller's name is free (``ray.kill`` is async)."""
    import ray
    import transfer_queue as tq

    tq.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
        except ValueError:
            return
        time.sleep(0.1)
    raise AssertionError("the TransferQueue controller did not go away within 30 s")
