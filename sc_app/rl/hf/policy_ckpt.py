"""Sharded policy checkpoints (hf backend) with ``torch.distributed.checkpoint`` (DCP).

Save: every trainer rank ``capture``s a CPU copy of its own shard of weights + optimizer state inside the train
step a bundle is cut at (a copy, so training goes on at once), then ``write``s it on a background thread: all
ranks write their shard files (``__<rank>_<n>.distcp``) into ``policy/`` in parallel, rank 0 the global
``.metadata`` and the model's config/tokenizer files (``hf/``), each rank hashing the files it wrote. DCP's
collectives run on a process group of their own (gloo), never on the training group, so a write on the io thread
cannot interleave with the training thread's collectives.

Load: DCP reshards on read, so a bundle saved by N ranks loads into M ranks (any strategy), weights and
optimizer state alike. Reads are verified (``verified_read``): ``VerifiedReader`` reads each file's bytes once,
checks them against the digest the caller took from the verified manifest, and deserialises only those bytes —
``.metadata`` (a pickle) through an unpickler that admits only DCP's metadata classes, tensors and non-tensor items
with ``torch.load(weights_only=True)``. A file not listed, or with other bytes, is ``PolicyIntegrityError``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from sc_app.checkpoint.writer import FileRecord
from sc_app.io import hashing, torch_files
from sc_app.io.durable import write_durable
from sc_app.rl.hf.policy_stream import HashingFileSystem, ItemTransforms
from sc_app.rl.hf.verified_read import PolicyIntegrityError, SafeLoadPlanner, VerifiedReader

POLICY_META_FORMAT = "sc_app.hf_policy"
POLICY_META_VERSION = 1
POLICY_FORMAT = "sc-app/dcp-v1"  # what manifests record in ``policy_format`` (``sc_app.checkpoint.policy_formats``)
MODEL_FILES_DIR = "hf"  # the model's config + tokenizer files the run started from (what an export needs)


@dataclass(frozen=True)
class PolicyMeta:
    version: int
    strategy: str
    world_size: int


@dataclass(frozen=True)
class CapturedPolicy:
    """One rank's CPU copy of its shard: ``{"model", "optimizer", "meta"}`` as DCP saves it."""

    state: dict[str, Any]
    version: int


@dataclass(frozen=True)
class PolicyWrite:
    """What one rank wrote: policy-dir-relative path → record; ``seconds`` of the whole write (DCP + hashing)."""

    files: dict[str, FileRecord]
    bytes: int
    seconds: float


# ------------------------------------------------------------------------------------------------ capture
class CaptureBuffers:
    """Two alternating CPU staging areas (DCP's ``DefaultStager``, which reuses its buffers between stages).

    The controller keeps at most one save in flight, so a capture may overlap the previous capture's write but
    never the one before it: capture ``k`` uses buffer ``k % 2``. A capture into a buffer whose write is still
    running would corrupt that write; ``capture`` refuses it instead."""

    def __init__(self, device: torch.device) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        cuda = device.type == "cuda"
        options = StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda
        )
        self._stagers = [DefaultStager(options), DefaultStager(options)]
        self._next = 0
        self._writing: set[int] = set()

    def warm(self, model: Any, optimizer: Any) -> None:
        """Stage into both buffers once, so their memory is allocated before the first save needs it."""
        msd, osd = get_state_dict(model, optimizer)
        for stager in self._stagers:
            stager.stage({"model": msd, "optimizer": osd})

    def capture(self, model: Any, optimizer: Any, meta: dict[str, Any]) -> tuple[int, CapturedPolicy]:
        slot = self._next
        if slot in self._writing:
            raise RuntimeError("capture into a staging buffer whose write has not finished (two saves in flight)")
        self._next = 1 - slot
        msd, osd = get_state_dict(model, optimizer)
        staged = self._stagers[slot].stage({"model": msd, "optimizer": osd})
        return slot, CapturedPolicy({**staged, "meta": dict(meta)}, int(meta["version"]))

    @contextmanager
    def writing(self, slot: int) -> Iterator[None]:
        self._writing.add(slot)
        try:
            yield
        finally:
            self._writing.discard(slot)

    def close(self) -> None:
        for s in self._stagers:
            s.close()


def policy_meta(version: int, strategy: str, world_size: int) -> dict[str, Any]:
    return {
        "format": POLICY_META_FORMAT,
        "format_version": POLICY_META_VERSION,
        "version": version,
        "strategy": strategy,
        "world_size": world_size,
    }


# ------------------------------------------------------------------------------------------------ write
def write(
    captured: CapturedPolicy,
    policy_dir: str | Path,
    *,
    rank: int,
    process_group: dist.ProcessGroup | None = None,
    model_files: Mapping[str, bytes] | None = None,
) -> PolicyWrite:
    """Collective over ``process_group`` (every rank calls it with the same ``policy_dir``, which must exist).

    Post: this rank's shard files (and on rank 0 ``.metadata`` and ``hf/``) are complete and fsynced; the
    returned records are the digest and size of exactly the bytes written (checked against the file sizes)."""
    t0 = time.perf_counter()
    out = Path(policy_dir)
    writer = FileSystemWriter(out, sync_files=True, overwrite=False)
    fs = HashingFileSystem()
    writer.fs = fs
    writer.transforms = ItemTransforms()  # DCP's, minus a wrapper call and a flush per write / item (same bytes)
    with _dcp_call(), torch_files.without_zip_crc():  # the files' digests stand behind them, not zip CRCs
        dcp.save(captured.state, storage_writer=writer, process_group=process_group, no_dist=not dist.is_initialized())
    files = dict(fs.records)
    if rank == 0 and model_files:
        (out / MODEL_FILES_DIR).mkdir(exist_ok=True)
        for name, data in sorted(model_files.items()):
            write_durable(out / MODEL_FILES_DIR / name, data)
            digest = hashing.digest_bytes(data, fs.hash_alg)
            files[f"{MODEL_FILES_DIR}/{name}"] = FileRecord(fs.hash_alg, digest, len(data))
    for name, record in files.items():
        size = (out / name).stat().st_size
        if size != record.size:
            raise OSError(f"{out / name}: {size} bytes on disk, {record.size} written")
    return PolicyWrite(files, sum(r.size for r in files.values()), time.perf_counter() - t0)


@contextmanager
def _dcp_call() -> Iterator[None]:
    """Around ``dcp.save`` / ``dcp.load``: raise a rank's own refusal or I/O error as itself (DCP folds every
    rank's failure into one ``CheckpointException``), and keep DCP's single-process notice out of the logs."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    except CheckpointException as exc:
        failures = [failure for failure, _ in exc.failures.values()]
        for kind in (PolicyIntegrityError, OSError):
            for failure in failures:
                if isinstance(failure, kind):
                    raise failure from None
        for failure in failures:
            text = str(failure)
            if text.startswith("Missing key in checkpoint state_dict: "):
                key = text.removeprefix("Missing key in checkpoint state_dict: ").rstrip(".")
                raise PolicyIntegrityError(
                    f"the policy checkpoint has no '{key}': it was written for another model or not by sc-app"
                ) from None
        raise


def _meta_template() -> dict[str, Any]:
    return {"format": "", "format_version": 0, "version": 0, "strategy": "", "world_size": 0}


def _checked_meta(meta: dict[str, Any], policy_dir: Path) -> PolicyMeta:
    if meta.get("format") != POLICY_META_FORMAT or meta.get("format_version") != POLICY_META_VERSION:
        raise PolicyIntegrityError(
            f"{policy_dir}: not an sc-app hf policy checkpoint (format {meta.get('format')!r} "
            f"v{meta.get('format_version')!r}, expected {POLICY_META_FORMAT} v{POLICY_META_VERSION})"
        )
    return PolicyMeta(int(meta["version"]), str(meta["strategy"]), int(meta["world_size"]))


def load(
    model: Any,
    optimizer: Any,
    policy_dir: str | Path,
    expected: Mapping[str, str],
    *,
    process_group: dist.ProcessGroup | None = None,
) -> PolicyMeta:
    """Collective: every rank loads its part (any world size and strategy) of weights and optimizer state."""
    d = Path(policy_dir)
    reader = VerifiedReader(d, expected)
    reader.read_metadata()  # a refused .metadata surfaces here, as itself
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optimizer": osd, "meta": _meta_template()}
    with _dcp_call():
        dcp.load(
            state,
            storage_reader=reader,
            planner=SafeLoadPlanner(),
            process_group=process_group,
            no_dist=not dist.is_initialized(),
        )
    meta = _checked_meta(state["meta"], d)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    return meta


def read_meta(policy_dir: str | Path, expected: Mapping[str, str]) -> PolicyMeta:
    """The bundle's policy meta, read in this process alone (no process group)."""
    d = Path(policy_dir)
    reader = VerifiedReader(d, expected)
    reader.read_metadata()
    state = {"meta": _meta_template()}
    with _dcp_call():
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return _checked_meta(state["meta"], d)


def read_model_state(policy_dir: str | Path, expected: Mapping[str, str], template: dict[str, torch.Tensor]) -> None:
    """Fill ``template`` (the full model state dict: name → tensor of the right shape) in place, in this process
    alone — the whole model, whatever world size wrote it."""
    reader = VerifiedReader(policy_dir, expected)
    reader.read_metadata()
    with _dcp_call():
        dcp.load({"model": template}, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
