"""data_plane.tq_fastpath: TransferQueue's per-call thread limiter, with the physical core count read once."""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator

import pytest

tq = pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

import transfer_queue.client as tq_client  # noqa: E402
from transfer_queue.utils import common  # noqa: E402

from sc_app.data_plane import tq_fastpath  # noqa: E402


@pytest.fixture
def pristine() -> Iterator[None]:
    """The client's limiter as shipped, put back after the test; the cached core count forgotten."""
    before = tq_client.limit_pytorch_auto_parallel_threads
    tq_client.limit_pytorch_auto_parallel_threads = common.limit_pytorch_auto_parallel_threads
    tq_fastpath.physical_cores.cache_clear()
    yield
    tq_client.limit_pytorch_auto_parallel_threads = before
    tq_fastpath.physical_cores.cache_clear()


def test_the_client_calls_the_limiter_by_the_name_install_replaces() -> None:
    for method in (tq_client.TransferQueueClient.async_put, tq_client.TransferQueueClient.async_get_data):
        assert "limit_pytorch_auto_parallel_threads(" in inspect.getsource(method)


def test_install_replaces_the_client_limiter_once(pristine: None) -> None:
    assert tq_fastpath.install(tq) is True
    assert tq_client.limit_pytorch_auto_parallel_threads is tq_fastpath.limit_threads
    assert tq_fastpath.install(tq) is True  # idempotent
    assert common.limit_pytorch_auto_parallel_threads is not tq_fastpath.limit_threads  # the library's own stays


def test_another_transferqueue_version_is_left_alone(pristine: None) -> None:
    assert tq_fastpath.install(types.SimpleNamespace(__version__="9.9.9")) is False
    assert tq_client.limit_pytorch_auto_parallel_threads is common.limit_pytorch_auto_parallel_threads


def test_cores_are_read_once_and_threads_are_limited_then_restored(
    pristine: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    calls = []

    def counting(logical: bool = True) -> int:
        calls.append(logical)
        return 2

    monkeypatch.setattr(psutil, "cpu_count", counting)
    outside = torch.get_num_threads()
    for target in (8, 1, None):
        with tq_fastpath.limit_threads(target_num_threads=target, info="test"):
            assert torch.get_num_threads() == (1 if target == 1 else 2)
        assert torch.get_num_threads() == common.DEFAULT_TORCH_NUM_THREADS
    assert calls == [False], "the physical core count must be read once per process"
    torch.set_num_threads(outside)
