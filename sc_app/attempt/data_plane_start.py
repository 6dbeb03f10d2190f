"""The job's bootstrap data-plane client (a set-up's, a warm reset's): TransferQueue started, its storage units
pinned where the job's other actors are expected to leave a CPU (``cluster_fit.held_cpus``, then
``sc_app.data_plane.tq_placement``), its start waiting within the caller's bound (``sc_app.waits``)."""

from __future__ import annotations

import ray

from sc_app.attempt.cluster_fit import held_cpus
from sc_app.config.app import AppConfig
from sc_app.data_plane.transferqueue import TransferQueueDataPlane


def bootstrap_data_plane(cfg: AppConfig) -> TransferQueueDataPlane:
    dp = cfg.data_plane
    held = held_cpus(cfg, ray.nodes(), first=ray.get_runtime_context().get_node_id())
    return TransferQueueDataPlane(
        bootstrap=True,
        namespace=cfg.ray.namespace,
        storage_units=dp.storage_units,
        storage_node_resource=dp.storage_node_resource,
        snapshot=dp.snapshot,
        held_cpus=held,
    )
