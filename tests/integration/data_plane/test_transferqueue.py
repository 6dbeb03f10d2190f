"""Restore ordering against real Ray and real TransferQueue (seed flow 1 and its admitted gap).

A restore is allowed only onto a TransferQueue that nothing has read or written — through the same client, through
another client in another process, or by a raw ``transfer_queue`` call that bypasses the adapter — and a
connect-only client may not exist before the restore decision is sealed.

One local Ray (the shared ``local_ray`` fixture). Every scenario gets its own untouched guard (a new namespace),
and the scenarios whose outcome depends on the stored rows (the raw bypass, the successful restore) also get a
*fresh* TransferQueue (the previous one is closed with ``tq.close()`` from this process, which initialised it).
Each refusal is matched on its message, so it can only have come from the touch that scenario made.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from sc_app.data_plane.client import CapturedRows, RestoreOrderError, RestoreRefused, RowsMissing  # noqa: E402
from sc_app.data_plane.guard import get_guard  # noqa: E402
from sc_app.data_plane.transferqueue import TransferQueueDataPlane  # noqa: E402
from tests.support.tq import close_transferqueue  # noqa: E402

pytestmark = pytest.mark.slow

PARTITION = "train"
T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def rows(n_groups: int = 2, group_size: int = 4, prefix: str = "g") -> tuple[list[str], TensorDict]:
    ids = [f"{prefix}{g}:{i}" for g in range(n_groups) for i in range(group_size)]
    n = len(ids)
    fields = TensorDict(
        {
            "tokens": torch.arange(n * 6, dtype=torch.long).view(n, 6),
            "reward": torch.linspace(0, 1, n),
        },
        batch_size=n,
    )
    return ids, fields


def fresh_data_plane(tag: str) -> tuple[TransferQueueDataPlane, str]:
    """Close whatever TransferQueue exists, then bootstrap a new one behind a new guard namespace."""
    close_transferqueue()
    client, ns = fresh_guard(tag)
    listing = tq.kv_list()
    assert sum(len(v) for v in listing.values()) == 0, "the fresh TransferQueue is not empty"
    return client, ns


def fresh_guard(tag: str) -> tuple[TransferQueueDataPlane, str]:
    """A bootstrap client on the *running* TransferQueue behind a new, untouched guard namespace.

    Cheaper than a fresh TransferQueue, and enough wherever the refusal asserted is the guard's: the adapter checks
    its own flag, then the guard, then the stored rows, and each says a different thing.
    """
    ns = f"sc_app_test_{tag}_{uuid.uuid4().hex[:6]}"
    client = TransferQueueDataPlane(bootstrap=True, namespace=ns, storage_units=1)
    assert ray.get(client._guard.touches.remote()) == []
    assert ray.get(client._guard.sealed.remote()) is None
    return client, ns


@ray.remote(num_cpus=0)
class OtherProcess:
    """Another process on the cluster: its own data-plane clients, or raw ``transfer_queue`` calls.

    One actor serves the whole module; every method first forgets the TransferQueue handles it cached for an
    earlier (now closed) scenario, so it attaches to the current one.
    """

    def _detach(self) -> None:
        import transfer_queue.interface as tqi

        if tqi._TQ_CLIENT is not None:
            tqi._TQ_CLIENT.close()
        tqi._TQ_CLIENT = None
        tqi._TQ_CONTROLLER = None

    def pid(self) -> int:
        return os.getpid()

    def adapter_put_get(self, namespace: str, ids: list[str], fields: Any) -> tuple[str, list[float]]:
        self._detach()
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        client = TransferQueueDataPlane(bootstrap=True, namespace=namespace, storage_units=1)

        async def go() -> Any:
            await client.put_samples("train", ids, fields)
            return await client.get_samples("train", ids, ["reward"])

        td = asyncio.run(go())
        return client.client_id, td["reward"].tolist()

    def raw_put(self, ids: list[str], fields: Any) -> int:
        self._detach()
        import transfer_queue as tq

        tq.init()  # attaches to the running TransferQueue; no sc_app code involved
        tq.kv_batch_put(keys=ids, partition_id="train", fields=fields)
        return sum(len(v) for v in tq.kv_list().values())

    def connect_only(self, namespace: str) -> str:
        self._detach()
        from sc_app.data_plane.client import RestoreOrderError
        from sc_app.data_plane.transferqueue import TransferQueueDataPlane

        try:
            TransferQueueDataPlane(bootstrap=False, namespace=namespace)
        except RestoreOrderError as exc:
            return f"RestoreOrderError: {exc}"
        return "built"


@pytest.fixture(scope="module")
def cluster(local_ray: Any) -> None:
    """The shared local Ray; each scenario below makes its own guard namespace (and TransferQueue where needed)."""


@pytest.fixture(scope="module")
def other(cluster: None) -> Any:
    actor = OtherProcess.remote()
    assert ray.get(actor.pid.remote()) != os.getpid()
    return actor


@dataclass
class Written:
    client: TransferQueueDataPlane
    namespace: str
    directory: Path
    ids: list[str]
    fields: TensorDict


@pytest.fixture(scope="module")
def written(cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Written:
    """A data plane written and read through its bootstrap client, and a snapshot of it on disk."""
    client, ns = fresh_data_plane("write")
    ids, fields = rows()
    directory = tmp_path_factory.mktemp("restore") / "data_plane"

    async def go() -> None:
        await client.put_samples(PARTITION, ids, fields, [{"group": i // 4} for i in range(len(ids))])
        back = await client.get_samples(PARTITION, ids)
        assert torch.equal(back["tokens"], fields["tokens"])
        assert await client.list_sample_ids(PARTITION) == set(ids)
        snapshot = await client.save_checkpoint(
            directory, {"digest": "d-test", "step": 3}, PARTITION, CapturedRows(ids)
        )
        await snapshot.write()

    arun(go())
    assert (directory / "metadata.json").exists()
    return Written(client, ns, directory, ids, fields)


# ------------------------------------------------------------------------------------------------ same process
def test_restore_after_write_through_same_client_is_refused(written: Written) -> None:
    with pytest.raises(RestoreRefused, match="already read or written"):
        written.client.load_checkpoint(written.directory)
    # a second client object (same process, never used) is refused by the shared guard, not by its own flag
    other = TransferQueueDataPlane(bootstrap=True, namespace=written.namespace, storage_units=1)
    with pytest.raises(RestoreRefused, match=written.client.client_id):
        other.load_checkpoint(written.directory)
    # nothing was loaded on top: the data plane still holds exactly what was written
    assert arun(other.list_sample_ids(PARTITION)) == set(written.ids)


def test_restore_after_read_only_through_same_client_is_refused(written: Written) -> None:
    client, ns = fresh_guard("read")
    assert arun(client.list_sample_ids(PARTITION)) == set(written.ids)  # a read, nothing written
    with pytest.raises(RestoreRefused, match="already read or written"):
        client.load_checkpoint(written.directory)
    other = TransferQueueDataPlane(bootstrap=True, namespace=ns, storage_units=1)
    with pytest.raises(RestoreRefused, match=f"{client.client_id} already did 'list_sample_ids'"):
        other.load_checkpoint(written.directory)
    assert {k for v in tq.kv_list().values() for k in v} == set(written.ids), "a refused restore changed rows"


# ------------------------------------------------------------------------------------------------ other processes
def test_restore_after_put_get_by_a_client_in_another_process_is_refused(written: Written, other: Any) -> None:
    driver, ns = fresh_guard("remote")
    ids, fields = rows(1, prefix="remote")
    remote_id, rewards = ray.get(other.adapter_put_get.remote(ns, ids, fields))
    assert str(ray.get(other.pid.remote())) in remote_id and remote_id != driver.client_id
    assert rewards == pytest.approx(fields["reward"].tolist())
    assert not driver._touched, "the driver's client itself never touched the data plane"
    with pytest.raises(RestoreRefused, match=f"{remote_id} already did 'put_samples'"):
        driver.load_checkpoint(written.directory)


def test_restore_after_raw_transfer_queue_write_from_another_process_is_refused(written: Written, other: Any) -> None:
    driver, _ = fresh_data_plane("raw")
    ids, fields = rows(1)
    assert ray.get(other.raw_put.remote(ids, fields)) == len(ids)
    assert ray.get(driver._guard.touches.remote()) == [], "the bypassing writer is invisible to the guard"
    with pytest.raises(RestoreRefused, match="already holds"):
        driver.load_checkpoint(written.directory)
    assert {k for v in tq.kv_list().values() for k in v} == set(ids), "the refused restore changed the rows"


# ------------------------------------------------------------------------------------------------ the happy path
def test_connect_only_before_seal_is_refused_then_restore_onto_untouched_works(written: Written, other: Any) -> None:
    driver, ns = fresh_data_plane("restore")
    with pytest.raises(RestoreOrderError, match="sealed"):
        TransferQueueDataPlane(bootstrap=False, namespace=ns)
    assert ray.get(other.connect_only.remote(ns)).startswith("RestoreOrderError")
    assert ray.get(driver._guard.touches.remote()) == [], "refused connect-only clients must not count as touches"

    meta = driver.load_checkpoint(written.directory)
    assert meta["digest"] == "d-test" and meta["step"] == 3
    driver.seal({"decision": "resume", "step": 3})
    assert ray.get(driver._guard.sealed.remote())["decision"] == "resume"

    with pytest.raises(RestoreRefused):  # one restore, once
        driver.load_checkpoint(written.directory)

    client = TransferQueueDataPlane(bootstrap=False, namespace=ns)  # allowed now
    assert ray.get(other.connect_only.remote(ns)) == "built"
    assert arun(client.list_sample_ids(PARTITION)) == set(written.ids)
    back = arun(client.get_samples(PARTITION, written.ids))
    assert torch.equal(back["tokens"], written.fields["tokens"])
    assert torch.allclose(back["reward"], written.fields["reward"])
    # TransferQueue's key lookup leaves out a key it does not hold; the adapter never returns the shorter batch
    asked = [*written.ids, "gone:0"]
    with pytest.raises(RowsMissing, match=f"a read of {len(asked)} rows of partition 'train' found {len(written.ids)}"):
        arun(client.get_samples(PARTITION, asked, ["reward"]))
    with pytest.raises(RowsMissing):
        client.get_samples_sync(PARTITION, asked, ["reward"])


def test_connect_only_with_no_bootstrap_at_all_is_an_order_error(cluster: None) -> None:
    """Nobody ever bootstrapped this namespace: the connect-only client must still say *order*, not crash."""
    ns = f"sc_app_test_never_{uuid.uuid4().hex[:6]}"
    with pytest.raises(RestoreOrderError):
        TransferQueueDataPlane(bootstrap=False, namespace=ns)
    with pytest.raises(RestoreOrderError, match="before any bootstrap client"):
        get_guard(ns, create=False)
