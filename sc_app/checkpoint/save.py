"""The write of a save behind training: everything after the barrier window.

The whole save order (seed), with the window's part in ``SaveCoordinator.capture`` (``sc_app.controller.saves``):
  policy → loader place → [barrier window: index → ``list_samples()`` == index → data-plane capture, freeze]
  → tmp_step_N/ (lease check) → policy files → loader file → data-plane bytes → thaw → sidecar → manifest
  → fsync → rename → prune.
Invariants: nothing is resumable until the rename (``BundleWriter.commit``); on any failure the tmp dir this save
created is removed and every older bundle is untouched; ``thaw()`` runs whether the data-plane write succeeded or
not, so the rows dropped meanwhile are cleared before the next window.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sc_app.checkpoint import layout
from sc_app.checkpoint.lease import LeaseLost
from sc_app.checkpoint.retention import prune
from sc_app.checkpoint.writer import BundleWriter, FileRecord
from sc_app.data_plane.client import DataPlaneSnapshot
from sc_app.faults import afault_point
from sc_app.io import torch_files
from sc_app.io.durable import utc_stamp

log = logging.getLogger(__name__)

InBackground = Callable[..., Awaitable[Any]]  # run a blocking function off the event loop, low priority


@dataclass(frozen=True)
class CapturedSave:
    """What the barrier window fixed for one bundle: the write behind training writes exactly this, nothing newer."""

    step: int
    run_id: str
    lineage: str | None
    fencing_epoch: int  # of the lease that wrote it; recorded as "epoch" (manifest, data-plane metadata)
    weights_version: int  # recorded on disk as trainer_version (manifest and data-plane metadata)
    loader_state: dict[str, Any]
    replay_index: dict[str, Any]  # TQReplayBuffer.metadata_state_dict(): the sidecar
    steps: tuple[dict[str, Any], ...] = ()  # the steps since the previous published bundle (run-log recovery)

    @property
    def digest(self) -> str:
        return str(self.replay_index["digest"])

    @property
    def groups(self) -> int:
        return len(self.replay_index["groups"])

    def data_plane_metadata(self) -> dict[str, Any]:
        """What the data-plane snapshot records about the bundle (``user_metadata`` of its metadata file)."""
        return {
            "step": self.step,
            "epoch": self.fencing_epoch,
            "trainer_version": self.weights_version,
            "loader": self.loader_summary(),
            "digest": self.digest,
            "groups": self.groups,
            "mode": "authoritative",
            "run_id": self.run_id,
        }

    def loader_summary(self) -> dict[str, int]:
        return {"next_index": self.loader_state["next_index"], "reissue": len(self.loader_state["reissue"])}

    def manifest_record(
        self,
        *,
        group_size: int,
        partition: str,
        compat: dict[str, Any],
        versions: dict[str, str],
        dataset: dict[str, Any] | None = None,
        policy_format: str | None = None,
    ) -> dict[str, Any]:
        """Everything ``manifest.json`` says about the bundle besides its step and files (``dataset``: the file
        the loader place points into, when the task reads one; ``policy_format``: the format of ``policy/`` when
        it is not the default, ``sc_app.checkpoint.policy_formats``)."""
        record: dict[str, Any] = {
            "run_id": self.run_id,
            "epoch": self.fencing_epoch,
            "created_at": utc_stamp(),
            "trainer_version": self.weights_version,
            "loader": self.loader_summary(),
            "replay": {
                "digest": self.digest,
                "groups": self.groups,
                "rows": self.groups * group_size,
                "partition": partition,
                "group_size": group_size,
            },
            "compat": compat,
            "versions": versions,
        }
        if self.lineage is not None:
            record["lineage"] = self.lineage
        if self.steps:
            record["steps"] = list(self.steps)
        if dataset is not None:
            record["dataset"] = dataset
        if policy_format is not None:
            record["policy_format"] = policy_format
        return record


def _prune_held(writer: BundleWriter, keep: int, newest: Path, lineage: str | None) -> list[str]:
    with writer.held():  # only while this run still holds the lease
        return prune(writer.root, keep, newest_verified=newest, expected_lineage=lineage)


@dataclass(frozen=True)
class PublishedBundle:
    path: Path  # ``step_N/`` (on the bucket only: ``on_bucket``)
    data_plane_bytes: int
    pruned: tuple[str, ...]
    on_bucket: Any = None  # committed on the bucket instead of renamed (``publish``): its ``UploadResult``


async def write_bundle(
    captured: CapturedSave,
    snapshot: DataPlaneSnapshot,
    writer: BundleWriter,
    *,
    write_policy: Callable[[Path], Awaitable[Mapping[str, FileRecord] | None]],
    thaw: Callable[[], Awaitable[None]],
    manifest_record: dict[str, Any],
    keep: int,
    in_background: InBackground,
    executor: Any = None,
    publish: Callable[[BundleWriter, dict[str, Any], dict[str, dict[str, Any]]], Any] | None = None,
) -> PublishedBundle:
    """Write ``captured`` and the data plane's ``snapshot`` of its rows into ``writer``'s tmp dir and publish it;
    then prune to ``keep`` bundles.

    ``write_policy(policy_dir)`` starts the trainers' write of the state they copied in the window and returns
    an awaitable of the files they hashed as they wrote them (policy-dir-relative name → ``FileRecord``; the
    commit reads only the others back); an ``OSError`` there is a failed save like any other I/O error.
    ``publish(writer, manifest_record, prehashed)``: commits the bundle somewhere else than by the rename (the
    bucket: ``sc_app.checkpoint.remote.parts``); no local retention runs then (no local bundle was added)."""
    policy_written: asyncio.Future[Any] | None = None
    try:
        try:
            await afault_point("save.begin")
            await in_background(writer.begin)  # makes tmp_step_N/; checks the lease under the dir lock
            policy_written = asyncio.ensure_future(write_policy(writer.policy_dir))
            policy_files = await policy_written
            await afault_point("save.policy")
            loader_file = await in_background(torch_files.save, captured.loader_state, writer.loader_path)
            await afault_point("save.loader")
            data_plane = await snapshot.write(executor=executor)
        finally:
            await thaw()
        await afault_point("save.snapshot")
        sidecar_file = await in_background(torch_files.save, captured.replay_index, writer.sidecar_path)
        await afault_point("save.sidecar")
        prehashed = {f"{layout.DATA_PLANE_DIR}/{name}": h for name, h in data_plane.get("files", {}).items()}
        for name, record in (policy_files or {}).items():
            prehashed[f"{layout.POLICY_DIR}/{name}"] = record.as_dict()
        prehashed[layout.LOADER_FILE] = loader_file.as_dict()
        prehashed[layout.SIDECAR_FILE] = sidecar_file.as_dict()
        if publish is not None:
            on_bucket = await in_background(publish, writer, manifest_record, prehashed)
        else:
            final = await in_background(writer.commit, manifest_record, prehashed)
    except BaseException:
        if policy_written is not None:  # let the trainer's write end before its directory goes
            await asyncio.gather(policy_written, return_exceptions=True)
        await in_background(writer.abort)
        raise
    await afault_point("save.done")
    if publish is not None:
        return PublishedBundle(writer.final, int(data_plane["bytes"]), (), on_bucket)
    try:
        removed = await in_background(_prune_held, writer, keep, final, captured.lineage)
    except (OSError, LeaseLost) as exc:  # the bundle is published; an old one left behind is no failed save
        log.warning("retention did not prune %s: %s; older bundles stay", writer.root, exc)
        removed = []
    return PublishedBundle(final, int(data_plane["bytes"]), tuple(removed))
