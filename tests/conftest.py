"""Fixtures shared across the suite.

``local_ray``: one real local Ray for every in-process integration test (a start costs ~10 s here); it stays up
until the session ends. ``fresh_transferqueue``: a real TransferQueue with one storage unit and no rows, started
anew for the test module (the one before is closed from this process, which initialised it).
``cli``: ``sc-app``'s ``main(argv)`` in this process, output captured, nothing left behind (``tests.support.cli``).
Tests that need a cluster of their own (``ray.cluster_utils.Cluster``) or a clean process run sc-app in a
subprocess instead (``tests.support.proc``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import durations
from tests.support.tq import close_transferqueue


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pods", action="store_true", help="also run the tests marked pods (make test-pods)")
    parser.addoption(
        "--record-durations",
        metavar="FILE",
        default=None,
        help="write each test file's seconds over FILE's record (`make test-durations`: tests/durations.json)",
    )


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("--record-durations")
    if record and not hasattr(config, "workerinput"):  # under xdist the controller gets every worker's reports
        config.pluginmanager.register(durations.Recorder(Path(record), config.rootpath), "record-durations")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest files first, by their recorded seconds (``tests/durations.json``, ``tests.support.durations``;
    the order inside a file kept): with a file per worker (``--dist loadfile``) a long file started last would run
    alone at the end. A test that uses ``local_ray`` (directly or through ``fresh_transferqueue``) is marked
    ``slow``, as are the modules that start a real run (``make test-quick`` leaves them out). Tests marked ``pods``
    run a real job across pod stand-ins (minutes each): ``make test-pods`` runs them, the default suite skips them
    and says so, to stay within its time budget."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by xdist in each worker
    items[:] = durations.order(items, durations.load(), built_once=("interrupted_run",), workers=workers)
    for item in items:
        if "local_ray" in getattr(item, "fixturenames", ()):  # a Ray start (~10 s) per worker, then real actors
            item.add_marker(pytest.mark.slow)
    if config.getoption("--pods"):
        return
    skip = pytest.mark.skip(reason="a real job across pod stand-ins: run by `make test-pods` (see ops/README.md)")
    for item in items:
        if item.get_closest_marker("pods"):
            item.add_marker(skip)


@pytest.fixture
def cli(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``cli(*argv, env=..., within=...)``: ``sc-app`` run in this process (``tests.support.cli.InProcess``)."""
    from tests.support.cli import InProcess

    return InProcess(capfd, monkeypatch)


@pytest.fixture(scope="session")
def local_ray() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.fail("Ray is already initialised in this process; in-process tests share the local_ray fixture")
    from sc_app.attempt.ray_start import job_runtime_env, start_ray

    start_ray(  # a start that times out on a loaded node (two suites on 2 cores) is retried once, as sc-app's is
        lambda: ray.init(
            address="local",
            num_cpus=8,
            include_dashboard=False,
            namespace="sc_app_test",
            log_to_driver=False,
            runtime_env=job_runtime_env({}),  # TransferQueue's actors start as the job's do
        ),
        ray.shutdown,
        what="the suite's local Ray",
    )
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


@pytest.fixture(scope="session")
def rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3 server (Ceph RADOS Gateway, ``tests/support/rgw.py``), one per worker process, started on first use
    and stopped by PID at the end; skipped, saying why, where Ceph's packages are not installed."""
    from tests.support.rgw import Rgw, skip_reason

    why = skip_reason()
    if why:
        pytest.skip(why)
    server = Rgw(tmp_path_factory.mktemp("rgw")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_remote(rgw: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``checkpoint.remote`` for a prefix of its own on the suite's radosgw, credentials in the environment."""
    import uuid

    from sc_app.config.remote import RemoteConfig

    for key, value in rgw.env().items():
        monkeypatch.setenv(key, value)
    prefix = f"{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:6]}"
    return RemoteConfig(
        url=f"s3://{rgw.bucket}/{prefix}", endpoint=rgw.endpoint, region="us-east-1", addressing_style="path",
        part_size_mib=5, request_timeout_s=10, bundle_deadline_s=120,
    )  # fmt: skip
