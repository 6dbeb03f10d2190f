"""Scenario for ``tests/e2e/test_multinode_snapshot.py``, run in a subprocess of its own (it starts a cluster).

A local multi-node Ray cluster (``ray.cluster_utils.Cluster``): a head (this driver, TransferQueue's controller)
and two worker nodes carrying ``tq_node``, so each of TransferQueue's two storage units lands on its own node.
Groups are committed through the product's buffer; a snapshot is cut as the controller cuts it and written — each
unit's stream in a ``StreamWorker`` on that unit's node (the nodes share this machine's filesystem, as pods share
a checkpoint volume); then the data plane is emptied and the bundle restored, again one worker per unit. The
bundle is written under the directory given as the one argument (the test's own). Prints one JSON document: where
every stream ran, which node each unit and worker is on, and the row sets and bytes compared (the test asserts on
it).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

G = 4
GROUPS = 24
PARTITION = "train"


def fields(seed: int) -> Any:
    import torch
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "tokens": torch.randint(0, 1000, (G, 64), generator=gen),
            "logprobs": torch.randn(G, 48, generator=gen),
            "reward": torch.rand(G, generator=gen),
        },
        batch_size=G,
    )


def digest(td: Any) -> str:
    from sc_app.data_plane.transferqueue import dense

    h = hashlib.sha256()
    td = dense(td)
    for key in sorted(td.keys()):
        h.update(key.encode())
        h.update(td[key].contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("transfer_queue").setLevel(logging.ERROR)
    import ray

    from tests.support.cluster import add_node, start_cluster

    cluster = start_cluster(num_cpus=4)
    try:
        nodes = [add_node(cluster, num_cpus=2, resources={"tq_node": 1}) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, namespace="mn_snapshot", log_to_driver=False)
        report = asyncio.run(scenario(cluster, [n.node_id for n in nodes], Path(sys.argv[1])))
        print(json.dumps(report))
        return 0
    finally:
        try:
            import transfer_queue as tq

            tq.close()
        finally:
            if ray.is_initialized():
                ray.shutdown()
            cluster.shutdown()


async def scenario(cluster: Any, tq_nodes: list[str], work: Path) -> dict[str, Any]:
    import ray
    import transfer_queue as tq

    from sc_app.data_plane import stream_io, units
    from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier
    from sc_app.data_plane.client import CapturedRows
    from sc_app.data_plane.replay_buffer import GroupCommit, TQReplayBuffer
    from sc_app.data_plane.transferqueue import TransferQueueDataPlane

    client = TransferQueueDataPlane(
        bootstrap=True, namespace=f"mn-{uuid.uuid4().hex[:6]}", storage_units=2, storage_node_resource="tq_node"
    )
    barrier = DataPlaneCheckpointBarrier()
    buffer = TQReplayBuffer(client, barrier, partition=PARTITION, group_size=G)
    expected = {}
    for b in range(0, GROUPS, 4):  # batched commits of 4 groups
        gids = [f"g{i}" for i in range(b, b + 4)]
        tds = [fields(i) for i in range(b, b + 4)]
        import torch
        from tensordict import TensorDict

        data = TensorDict({k: torch.cat([td[k] for td in tds]) for k in tds[0].keys()}, batch_size=4 * G)  # noqa: SIM118
        await buffer.commit_groups([GroupCommit(g, int(g[1:]), 1) for g in gids], data)
        for gid, td in zip(gids, tds, strict=True):
            expected[gid] = digest(td)
    await buffer.drop(["g3", "g10"])
    expected.pop("g3"), expected.pop("g10")

    directory = work / "data_plane"
    async with barrier.checkpoint():
        meta = buffer.metadata_state_dict()
        listed = await client.list_samples(PARTITION)
        assert set(listed) == buffer.sample_ids()
        snap = await client.save_checkpoint(
            directory,
            {"digest": meta["digest"]},
            PARTITION,
            CapturedRows(sorted(listed), field_names=buffer.field_names_by_group(), tags=listed),
        )
        buffer.freeze(set(listed))
    stats = await snap.write()
    await buffer.thaw()

    tq_client = units.tq_client(tq)
    unit_nodes = units.unit_nodes(tq_client)
    workers = {node: ray.get(handle.node.remote()) for node, handle in stream_io._workers.items()}
    doc = json.loads((directory / "metadata.json").read_text())

    # empty the data plane, restore from the snapshot through a fresh guard, read every group back
    for rows in tq.kv_list().values():
        if rows:
            tq.kv_clear(keys=list(rows), partition_id=PARTITION)
    restorer = TransferQueueDataPlane(bootstrap=True, namespace=f"mn-{uuid.uuid4().hex[:6]}")
    restored_meta = await asyncio.to_thread(restorer.load_checkpoint, directory)
    listing = tq.kv_list(PARTITION).get(PARTITION, {})
    got = {}
    for gid in expected:
        ids = [f"{gid}:{r}" for r in range(G)]
        got[gid] = digest(await tq.async_kv_batch_get(keys=ids, partition_id=PARTITION))
    tags_ok = all(listing.get(f"{gid}:{r}") == {"group": gid, "version": 1} for gid in expected for r in range(G))
    stream_io.shutdown_workers()
    return {
        "tq_nodes": sorted(tq_nodes),
        "head": cluster.head_node.node_id,
        "unit_nodes": unit_nodes,
        "save_streams": snap.streams,
        "worker_nodes": workers,
        "streams_in_metadata": len(doc["streams"]),
        "rows_written": stats["rows"],
        "restore_streams": (restorer.last_restore or {}).get("streams"),
        "restored_digest": restored_meta.get("digest") == meta["digest"],
        "row_set_equal": set(listing) == {f"{gid}:{r}" for gid in expected for r in range(G)},
        "bytes_equal": got == expected,
        "tags_equal": tags_ok,
    }


if __name__ == "__main__":
    sys.exit(main())
