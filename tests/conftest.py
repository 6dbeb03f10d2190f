"""Fixtures shared across the suite.

``local_ray``: one real local Ray for every in-process integration test (a start costs ~10 s here); it stays up
until the session ends. ``fresh_transferqueue``: a real TransferQueue with one storage unit and no rows, started
anew for the test module (the one before is closed from this process, which initialised it).
Tests that need a cluster of their own (``ray.cluster_utils.Cluster``) or a clean process run sc-app in a
subprocess instead (``tests.support.proc``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.tq import close_transferqueue


@pytest.fixture(scope="session")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.fail("Ray is already initialised in this process; in-process tests share the local_ray fixture")
    ray.init(address="local", num_cpus=8, include_dashboard=False, namespace="sc_app_test", log_to_driver=False)
    try:
        yield ray
    finally:
        import transfer_queue as tq

        tq.close()
        ray.shutdown()


@pytest.fixture(scope="module")
def fresh_transferqueue(local_ray: Any) -> Any:
    """The ``transfer_queue`` module, attached to a TransferQueue nothing has touched (1 storage unit); one per
    test module."""
    import transfer_queue as tq

    from sc_app.data_plane.transferqueue import tq_conf

    close_transferqueue()
    tq.init(tq_conf(1, None))
    return tq
