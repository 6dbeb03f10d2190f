"""What the controller actor is built from: ``SingleControllerActorArgs`` (seed flow 2: everything, built on the
driver, pickled once) and how it connects its data-plane client (``Connect``; TransferQueue's by default)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sc_app.checkpoint.lease import Lease
from sc_app.checkpoint.remote.parts import RemoteLink
from sc_app.config.app import AppConfig
from sc_app.data_plane.client import DataPlaneClient
from sc_app.rl.backend import PolicyFingerprint

Connect = Callable[[AppConfig], DataPlaneClient]  # builds the controller's connect-only data-plane client


def connect_transferqueue(cfg: AppConfig) -> DataPlaneClient:
    """The connect-only TransferQueue client (refused by the guard until the driver sealed the restore)."""
    from sc_app.data_plane.transferqueue import TransferQueueDataPlane

    return TransferQueueDataPlane(bootstrap=False, namespace=cfg.ray.namespace, snapshot=cfg.data_plane.snapshot)


@dataclass
class SingleControllerActorArgs:
    """Everything the controller needs, built on the driver, pickled once."""

    cfg_json: str
    run_id: str
    trainers: list[Any]
    generators: list[Any]
    start_step: int = 0
    start_version: int = 0
    loader_state: dict[str, Any] | None = None
    sidecar_path: str | None = None
    data_plane_checkpoint_metadata: dict[str, Any] | None = None  # what the driver restored (flow 1 → 2)
    lease: Lease | None = None
    lineage: str | None = None  # the checkpoint directory's lineage, recorded in every manifest
    dataset: dict[str, Any] | None = None  # the task's dataset file (path, sha256, rows): recorded in every bundle
    restored_fingerprint: PolicyFingerprint | None = None  # of the state the trainers restored (traced at start)
    epoch: int | None = None  # the fencing epoch every call to a worker carries (sc_app.rl.fencing); None: unfenced
    remote: RemoteLink | None = None  # checkpoint.remote.parts=direct: bundles are committed on the bucket


def disconnect_transferqueue() -> None:
    """Forget this process's TransferQueue attachment (a warm in-job restore rebuilt the data plane)."""
    from sc_app.data_plane.transferqueue import detach_transferqueue

    detach_transferqueue()
