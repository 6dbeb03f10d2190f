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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pods", action="store_true", help="also run the tests marked pods (make test-pods)")


# The longest modules (by `--durations` on a quiet 2-core machine), handed to the two workers first: with a
# file per worker (`--dist loadfile`) a long module started last would run alone at the end.
LONGEST_FIRST = (
    "tests/e2e/test_hf_run.py",
    "tests/e2e/test_vllm_run.py",
    "tests/e2e/test_observe.py",
    "tests/e2e/test_reliability.py",
    "tests/e2e/test_bystanders.py",
    "tests/e2e/test_bench_quick.py",
    "tests/e2e/test_in_job_restore.py",
    "tests/e2e/test_corruption.py",
    "tests/e2e/test_run.py",
    "tests/e2e/test_in_job_recovery.py",
    "tests/e2e/test_node_loss.py",
    "tests/k8s/test_manifest_e2e.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest modules first (``LONGEST_FIRST``; the order inside a module kept). Tests marked ``pods`` run a
    real job across pod stand-ins (minutes each): ``make test-pods`` runs them, the default suite skips them and
    says so, to stay within its time budget."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest in order
    if config.getoption("--pods"):
        return
    skip = pytest.mark.skip(reason="a real job across pod stand-ins: run by `make test-pods` (see ops/README.md)")
    for item in items:
        if item.get_closest_marker("pods"):
            item.add_marker(skip)


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


@pytest.fixture(scope="session")
def interrupted_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The suite's one interrupted run (``tests/support/interrupted.py``: fresh, SIGKILLed after a bundle, stopped
    by SIGTERM, resumed to the end), built once per session across xdist workers; read-only for its users."""
    from tests.support import interrupted
    from tests.support.shared import built_once

    return built_once(tmp_path_factory, "interrupted_run", interrupted.build, interrupted.save, interrupted.load)

