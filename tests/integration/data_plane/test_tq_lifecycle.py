"""data_plane.tq_lifecycle against real Ray + real TransferQueue: ``start`` makes the same TransferQueue as
``tq.init``, with the storage units asked for before the controller is waited on (``tq.init`` itself where it does
not reproduce it); ``stop`` kills the units it made instead of their graceful shutdown, the controller live or dead."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from omegaconf import OmegaConf  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from transfer_queue import interface  # noqa: E402
from transfer_queue.storage.bootstrap import simple_storage_bootstrap  # noqa: E402

from sc_app.data_plane import tq_lifecycle  # noqa: E402
from sc_app.data_plane.transferqueue import tq_conf  # noqa: E402
from tests.support.proc import wait_for  # noqa: E402
from tests.support.tq import close_transferqueue  # noqa: E402

pytestmark = pytest.mark.slow

UNITS = 2


def stored_config() -> Any:
    """The config the running TransferQueue's controller holds (what every process that attaches is built from)."""
    controller = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    return ray.get(controller.get_config.remote())


def without_addresses(conf: Any) -> dict[str, Any]:
    """The config less what differs between two starts of the same TransferQueue (the actors' addresses)."""
    plain = copy.deepcopy(conf)
    plain.controller.zmq_info = None
    plain.backend.SimpleStorage.zmq_info = None
    out = OmegaConf.to_container(plain)
    assert isinstance(out, dict)
    return out


def round_trip() -> None:
    """A put and a get through this process's client: the controller and both units answer."""
    data = TensorDict({"x": torch.arange(8).reshape(4, 2)}, batch_size=[4])
    tq.kv_batch_put(keys=[f"k{i}" for i in range(4)], partition_id="p", fields=data)
    got = tq.kv_batch_get(keys=[f"k{i}" for i in range(4)], partition_id="p")
    assert torch.equal(torch.stack(list(got["x"].unbind(0))), data["x"])
    tq.kv_clear(keys=[f"k{i}" for i in range(4)], partition_id="p")


@pytest.fixture
def fresh(local_ray: Any) -> Any:
    close_transferqueue()
    yield
    close_transferqueue()


def test_the_same_transferqueue_as_tq_init_with_the_units_asked_for_first(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tq.init(tq_conf(UNITS, None))
    reference = stored_config()
    round_trip()
    close_transferqueue()

    waited: list[tuple[str, bool]] = []  # (what was waited for, were the units already asked for)
    real = interface.process_zmq_server_info

    def watched(handlers: Any) -> Any:
        waited.append(("units" if isinstance(handlers, dict) else "controller", bool(interface._TQ_STORAGE)))
        return real(handlers)

    monkeypatch.setattr(interface, "process_zmq_server_info", watched)
    monkeypatch.setattr(simple_storage_bootstrap, "process_zmq_server_info", watched)
    monkeypatch.setattr(tq, "init", lambda *a, **k: pytest.fail("tq_lifecycle fell back to tq.init"))
    tq_lifecycle.start(tq_conf(UNITS, None))

    assert [w for w, _ in waited] == ["units", "controller"]
    assert waited[1][1], "the controller was waited for before the storage units were asked for"
    ours = stored_config()
    assert without_addresses(ours) == without_addresses(reference)
    assert len(ours.backend.SimpleStorage.zmq_info) == UNITS
    assert ours.controller.zmq_info is not None
    assert interface._TQ_CLIENT is not None and interface._TQ_CONTROLLER is not None
    round_trip()
    units = list(interface._TQ_STORAGE["SimpleStorage"].values())
    tq_lifecycle.stop()
    assert_stopped(units)


def closing(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What ``tq.close`` was left to shut down gracefully, call by call (the storage units, or None)."""
    seen: list[Any] = []
    real = tq.close

    def watched() -> None:
        seen.append(interface._TQ_STORAGE)
        real()

    monkeypatch.setattr(tq, "close", watched)
    return seen


def _dead(unit: Any) -> bool:
    try:
        ray.get(unit.get_zmq_server_info.remote(), timeout=5)
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:  # not answering yet says nothing: ask again
        return False
    return False


def assert_stopped(units: list[Any], within_s: float = 30.0) -> None:
    """Each unit dead within ``within_s`` (all together): ``ray.kill`` is asynchronous, so a call sent right after it
    may still be answered (under load it was, once); a unit that keeps answering fails."""
    deadline = time.monotonic() + within_s
    for unit in units:
        left = max(0.1, deadline - time.monotonic())
        wait_for(lambda u=unit: _dead(u), left, f"a storage unit to be dead {within_s:g}s after the stop", poll=0.2)
    close_transferqueue()  # waits until the controller's name is free (ray.kill is asynchronous)
    assert interface._TQ_CLIENT is None and interface._TQ_CONTROLLER is None and interface._TQ_STORAGE is None


@pytest.mark.parametrize("controller", ["live", "dead"])
def test_stop_kills_the_units_it_made_without_their_graceful_shutdown(
    fresh: None, monkeypatch: pytest.MonkeyPatch, controller: str
) -> None:
    tq_lifecycle.start(tq_conf(UNITS, None))
    round_trip()
    units = list(interface._TQ_STORAGE["SimpleStorage"].values())
    if controller == "dead":  # a warm restore after the TransferQueue controller's death
        ray.kill(interface._TQ_CONTROLLER)
    seen = closing(monkeypatch)
    tq_lifecycle.stop()
    assert seen == [None], "the units were handed to tq.close's graceful shutdown"
    assert_stopped(units)


def test_stop_leaves_units_tq_init_made_to_tq_close(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tq.init(tq_conf(1, None))
    units = list(interface._TQ_STORAGE["SimpleStorage"].values())
    seen = closing(monkeypatch)
    tq_lifecycle.stop()
    assert len(seen) == 1 and seen[0] is not None and list(seen[0]["SimpleStorage"].values()) == units
    assert_stopped(units)


@ray.remote(num_cpus=0)
def start_elsewhere(units: int) -> tuple[str, bool]:
    """``tq_lifecycle.start`` in another process while TransferQueue runs: the controller it is attached to, and
    whether it started storage units of its own; a put and a get through it."""
    from transfer_queue import interface as there

    tq_lifecycle.start(tq_conf(units, None))
    round_trip()
    attached = there._TQ_CONTROLLER._actor_id.hex(), there._TQ_STORAGE is None
    there._TQ_CLIENT.close()
    return attached


def test_a_running_transferqueue_is_attached_to_not_started_again(fresh: None) -> None:
    tq_lifecycle.start(tq_conf(UNITS, None))
    controller = interface._TQ_CONTROLLER._actor_id.hex()
    # another unit count: ignored when attaching, as tq.init ignores its conf then
    assert ray.get(start_elsewhere.remote(1), timeout=120) == (controller, True)
    assert len(stored_config().backend.SimpleStorage.zmq_info) == UNITS
    round_trip()


@pytest.mark.parametrize("case", ["another TransferQueue version", "metrics on"])
def test_what_it_does_not_reproduce_is_tq_init_itself(fresh: None, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    conf = tq_conf(UNITS, None)
    if case == "another TransferQueue version":
        monkeypatch.setattr(tq, "__version__", "0.2.0")
    else:
        conf.metrics = {"enabled": True, "port": 0}
    called: list[Any] = []
    monkeypatch.setattr(tq, "init", lambda c=None: called.append(c))
    tq_lifecycle.start(conf)
    assert called == [conf]
    assert interface._TQ_CONTROLLER is None, "it started TransferQueue itself as well"
