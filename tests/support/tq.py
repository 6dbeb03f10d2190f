"""TransferQueue helpers for in-process integration tests (with the ``local_ray`` fixture)."""

from __future__ import annotations

import time


def close_transferqueue(timeout_s: float = 30) -> None:
    """Close the running TransferQueue and wait until its controller's name is free (``ray.kill`` is async); the
    bench uses it too."""
    import ray
    import transfer_queue as tq

    tq.close()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
        except ValueError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the TransferQueue controller did not go away within {timeout_s:g} s")
