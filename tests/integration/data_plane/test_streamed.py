"""Streamed data-plane snapshot against real Ray + real TransferQueue (one of each for the whole module).

What is proved here:
* consistency of the deferred write: rows committed *while* ``write()`` copies (a commit is forced between every
  read) never appear in the snapshot; the snapshot holds exactly the captured index and fields — a captured group
  dropped before the write (its clear deferred to ``thaw()``) is still in it, a field the advantage stage adds to
  a captured group after the window is not; the sha256 ``write()`` reports is that of the bytes on disk;
* restore reproduces every row bit for bit with its tags, one put per group;
* a streamed directory holds only JSON and raw tensor bytes (no pickle, no torch.save zip);
* ``load_checkpoint`` still dispatches to TransferQueue's native format, and restore refusal still holds.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import blake3
import pytest

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
torch = pytest.importorskip("torch")

from tensordict import TensorDict  # noqa: E402

from sc_app.checkpoint.verify import data_plane_digest  # noqa: E402
from sc_app.data_plane.barrier import DataPlaneCheckpointBarrier  # noqa: E402
from sc_app.data_plane.client import CapturedRows, RestoreRefused  # noqa: E402
from sc_app.data_plane.replay_buffer import TQReplayBuffer  # noqa: E402
from sc_app.data_plane.stream_io import RowSource  # noqa: E402
from sc_app.data_plane.streamed_format import (  # noqa: E402
    STREAMED_FORMAT,
    STREAMED_FORMAT_V1,
    PartWriter,
    iter_groups,
    read_metadata,
)
from sc_app.data_plane.transferqueue import TransferQueueDataPlane, dense  # noqa: E402

G = 4  # rows per group
PARTITION = "train"


@pytest.fixture(scope="module")
def tq_system(fresh_transferqueue: Any) -> Any:
    return fresh_transferqueue


def _fields(seed: int) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "tokens": torch.randint(0, 1000, (G, 12), generator=gen),
            "logprobs": torch.randn(G, 8, generator=gen),
            "reward": torch.rand(G, generator=gen),
            "hidden": torch.randn(G, 3, 16, generator=gen).to(torch.bfloat16),
        },
        batch_size=G,
    )


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def _same_rows(got: TensorDict, want: TensorDict) -> None:
    assert set(got.keys()) == set(want.keys())
    for k in want.keys():  # noqa: SIM118 - iterating a TensorDict walks its batch, not its keys
        g, w = got[k], want[k]
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), k
        assert _bits(g) == _bits(w), f"field {k} differs"


def _clear_everything() -> None:
    for part, rows in tq.kv_list().items():
        if rows:
            tq.kv_clear(keys=list(rows), partition_id=part)


def _fresh_client() -> TransferQueueDataPlane:
    """A bootstrap client with its own guard (a fresh namespace), on a data plane holding no rows."""
    _clear_everything()
    return TransferQueueDataPlane(bootstrap=True, namespace=f"t-{uuid.uuid4().hex[:8]}")


class GatedSource(RowSource):
    """The snapshot's reads: before each one, wait until one more concurrent commit has landed."""

    def __init__(self, committed: asyncio.Queue[str]) -> None:
        super().__init__(tq, PARTITION)
        self._committed = committed
        self.reads: list[list[str]] = []

    async def get(self, segments: list[Any]) -> Any:
        await asyncio.wait_for(self._committed.get(), timeout=30)
        self.reads.append([sid for seg in segments for sid in seg.ids])
        return await super().get(segments)


@pytest.fixture(scope="module")
def saved(tq_system: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Commit groups, capture a snapshot in the window, write it while commits stream in; also a native save."""
    root = tmp_path_factory.mktemp("streamed")
    client = _fresh_client()

    async def scenario() -> dict[str, Any]:
        barrier = DataPlaneCheckpointBarrier()
        buffer = TQReplayBuffer(client, barrier, partition=PARTITION, group_size=G)
        expected: dict[str, TensorDict] = {}
        for i in range(6):
            fields = _fields(i)
            await buffer.commit(f"g{i}", i, 100 + i, fields)
            expected[f"g{i}"] = fields
        # an overwrite *before* the capture (what the advantage stage does) is part of the snapshot
        adv = torch.arange(G, dtype=torch.float32) / 7
        await buffer.write_fields(["g0"], TensorDict({"advantage": adv}, [G]))
        expected["g0"] = expected["g0"].clone()
        expected["g0"]["advantage"] = adv

        async with barrier.checkpoint():  # the capture exactly as SaveCoordinator._save cuts it
            meta = buffer.metadata_state_dict()
            listed = await client.list_samples(PARTITION)
            stored = set(listed)
            assert stored == buffer.sample_ids()
            snap = await client.save_checkpoint(
                root / "streamed",
                {"digest": meta["digest"], "step": 3},
                PARTITION,
                CapturedRows(sorted(stored), field_names=buffer.field_names_by_group(), tags=listed),
            )
            buffer.freeze(stored)
        captured = set(stored)
        # after the window, before the copy: the train pump trains on g1 and g2 (advantage onto g2, then drops g1)
        await buffer.write_fields(["g2"], TensorDict({"advantage": torch.full((G,), 9.0)}, [G]))
        await buffer.drop(["g1"])
        assert "g1:0" in await client.list_sample_ids(PARTITION), "a captured row was cleared before the copy"
        committed: asyncio.Queue[str] = asyncio.Queue()
        gated = GatedSource(committed)
        snap.source = gated  # type: ignore[attr-defined]
        snap.part_bytes = 1024  # type: ignore[attr-defined]  # several part files
        snap.gets_in_flight = 1  # type: ignore[attr-defined]

        async def stream_commits() -> list[str]:
            new = []
            for j in range(len(expected) + 2):
                gid = f"late{j}"
                await buffer.commit(gid, 1000 + j, 200, _fields(1000 + j))
                new.append(gid)
                committed.put_nowait(gid)
            return new

        committer = asyncio.create_task(stream_commits())
        stats = await snap.write()
        await buffer.thaw()
        assert "g1:0" not in await client.list_sample_ids(PARTITION), "thaw() must clear the deferred drop"
        late = await committer
        # the late groups were committed while the copy ran: they are in TransferQueue but not in the snapshot
        read = [sid for keys in gated.reads for sid in keys]
        assert sorted(read) == sorted(captured), "the copy must read every captured row once, and nothing else"
        # g0 (it has an extra field) is read alone; the small groups after it share gets, sized from g0's bytes
        assert gated.reads[0] == [f"g0:{r}" for r in range(G)] and 1 < len(gated.reads) < len(expected)
        now = await client.list_sample_ids(PARTITION)
        assert all(f"{gid}:0" in now for gid in late)

        async with barrier.checkpoint():
            native_meta = buffer.metadata_state_dict()
            native_ids = await client.list_sample_ids(PARTITION)
            client.snapshot = "native"
            native = await client.save_checkpoint(
                root / "native", {"digest": native_meta["digest"]}, PARTITION, CapturedRows(sorted(native_ids))
            )
            client.snapshot = "streamed"
        await native.write()
        native_expected = {gid: td for gid, td in expected.items() if gid != "g1"}  # g1 was dropped
        native_expected["g2"] = expected["g2"].clone()
        native_expected["g2"]["advantage"] = torch.full((G,), 9.0)
        for j, gid in enumerate(late):
            native_expected[gid] = _fields(1000 + j)
        return {
            "root": root,
            "captured": captured,
            "expected": expected,
            "stats": stats,
            "digest": meta["digest"],
            "native_ids": set(native_ids),
            "native_expected": native_expected,
            "native_digest": native_meta["digest"],
        }

    return asyncio.run(scenario())


def test_snapshot_holds_exactly_the_captured_rows(saved: dict[str, Any]) -> None:
    directory = saved["root"] / "streamed"
    doc = read_metadata(directory)
    assert doc["format"] == STREAMED_FORMAT and doc["partition"] == PARTITION
    assert len(doc["parts"]) > 1
    assert doc["rows"] == len(saved["captured"]) == saved["stats"]["rows"]
    groups = list(iter_groups(directory))
    stored_ids = [sid for g in groups for sid in g.ids]
    assert len(stored_ids) == len(set(stored_ids))
    assert set(stored_ids) == saved["captured"], "snapshot differs from the captured index"
    assert not any(sid.startswith("late") for sid in stored_ids)
    for g in groups:
        _same_rows(g.data, saved["expected"][g.group])
        assert all(tag == {"group": g.group, "version": 100 + int(g.group[1:])} for tag in g.tags)


def test_write_reports_the_sha256_of_every_file_it_wrote(saved: dict[str, Any]) -> None:

    directory = saved["root"] / "streamed"
    files = saved["stats"]["files"]
    assert set(files) == {p.name for p in directory.iterdir()}
    for name, info in files.items():
        data = (directory / name).read_bytes()
        assert info == {"alg": "blake3", "digest": blake3.blake3(data).hexdigest(), "size": len(data)}, name


def test_streamed_dir_has_no_pickle(saved: dict[str, Any]) -> None:
    directory = saved["root"] / "streamed"
    doc = json.loads((directory / "metadata.json").read_text())
    assert doc["user_metadata"]["digest"] == saved["digest"]
    # the checkpoint verifier reads the digest from the same place
    bundle = saved["root"] / "bundle"
    (bundle / "data_plane").mkdir(parents=True)
    (bundle / "data_plane" / "metadata.json").write_bytes((directory / "metadata.json").read_bytes())
    assert data_plane_digest(bundle) == saved["digest"]
    for p in directory.iterdir():
        assert p.suffix in {".json", ".bin"}, p
        assert p.read_bytes()[:2] != b"PK", f"{p} looks like a torch.save zip"
        if p.suffix == ".json":
            json.loads(p.read_text())
        else:
            header = json.loads(p.with_suffix(".json").read_text())
            end = max(spec["offset"] + spec["nbytes"] for s in header["segments"] for spec in s["fields"].values())
            assert p.stat().st_size == header["bytes"] == end, "a .bin holds only the declared tensor bytes"


def test_restore_roundtrip_bit_for_bit_one_put_per_group(saved: dict[str, Any], monkeypatch: Any) -> None:
    client = _fresh_client()
    puts: list[list[str]] = []
    original = RowSource.put

    async def counting(self: RowSource, group: Any, global_indexes: list[int]) -> None:
        puts.append(list(group.ids))
        await original(self, group, global_indexes)

    monkeypatch.setattr(RowSource, "put", counting)
    meta = client.load_checkpoint(saved["root"] / "streamed")
    monkeypatch.undo()
    assert meta["digest"] == saved["digest"]
    listing = tq.kv_list(PARTITION)[PARTITION]
    assert set(listing) == saved["captured"]
    assert sorted(map(sorted, puts)) == sorted(sorted(f"{gid}:{r}" for r in range(G)) for gid in saved["expected"]), (
        "restore must put exactly one whole group per put (one storage unit: a segment is a group)"
    )
    for gid, want in saved["expected"].items():
        ids = [f"{gid}:{r}" for r in range(G)]
        assert all(listing[sid] == {"group": gid, "version": 100 + int(gid[1:])} for sid in ids)
        _same_rows(dense(tq.kv_batch_get(keys=ids, partition_id=PARTITION)), want)
    # restore refusal still holds: this client touched the data plane; a second restore is refused
    with pytest.raises(RestoreRefused):
        client.load_checkpoint(saved["root"] / "streamed")


def test_restore_refused_when_rows_exist_or_client_touched(saved: dict[str, Any]) -> None:
    client = _fresh_client()
    asyncio.run(client.put_samples("other", ["x:0", "x:1"], TensorDict({"a": torch.ones(2)}, [2])))
    with pytest.raises(RestoreRefused, match="already read or written"):
        client.load_checkpoint(saved["root"] / "streamed")
    other = TransferQueueDataPlane(bootstrap=True, namespace=f"t-{uuid.uuid4().hex[:8]}")
    with pytest.raises(RestoreRefused, match="already holds"):
        other.load_checkpoint(saved["root"] / "streamed")
    _clear_everything()


def test_native_format_still_restores(saved: dict[str, Any]) -> None:
    directory = saved["root"] / "native"
    assert (directory / "controller_state.pkl").exists()  # TransferQueue's own (pickled) layout
    client = _fresh_client()
    meta = client.load_checkpoint(directory)
    assert meta["digest"] == saved["native_digest"]
    listing = tq.kv_list(PARTITION)[PARTITION]
    assert set(listing) == saved["native_ids"]
    for gid, want in saved["native_expected"].items():
        ids = [f"{gid}:{r}" for r in range(G)]
        _same_rows(dense(tq.kv_batch_get(keys=ids, partition_id=PARTITION)), want)
    _clear_everything()


def test_sample_ids_without_group_part_are_refused(tq_system: Any, tmp_path: Path) -> None:
    from sc_app.data_plane.streamed import StreamedSnapshot

    with pytest.raises(ValueError, match="no group part"):
        StreamedSnapshot.capture(tq, tmp_path, {}, PARTITION, CapturedRows(["nogroup"]))


def test_a_v1_directory_still_restores(tq_system: Any, tmp_path: Path) -> None:
    """Bundles written before the per-unit streams (``sc-app/streamed-v1``: one stream, ``part-NNNNN``) restore."""
    from sc_app.data_plane.streamed_format import write_metadata

    writer = PartWriter(tmp_path, 1 << 20, prefix="part")
    expected = {f"v{i}": _fields(50 + i) for i in range(3)}
    for gid, td in expected.items():
        writer.append(gid, [f"{gid}:{r}" for r in range(G)], [{"group": gid, "version": 1}] * G, td)
    writer.finish()
    for header in tmp_path.glob("part-*.json"):  # what a v1 writer wrote: its own format in every header
        header.write_text(header.read_text().replace(STREAMED_FORMAT, STREAMED_FORMAT_V1))
    doc = {
        "format": STREAMED_FORMAT_V1,
        "partition": PARTITION,
        "rows": writer.rows,
        "groups": writer.groups,
        "bytes": writer.bytes,
        "parts": writer.parts,
        "user_metadata": {"digest": "v1-digest"},
    }
    write_metadata(tmp_path, doc)
    assert [p.name for p in sorted(tmp_path.glob("*.bin"))] == ["part-00000.bin"]
    client = _fresh_client()
    assert client.load_checkpoint(tmp_path)["digest"] == "v1-digest"
    listing = tq.kv_list(PARTITION)[PARTITION]
    for gid, want in expected.items():
        ids = [f"{gid}:{r}" for r in range(G)]
        assert all(listing[sid] == {"group": gid, "version": 1} for sid in ids)
        _same_rows(dense(tq.kv_batch_get(keys=ids, partition_id=PARTITION)), want)
    _clear_everything()
