"""What a job asks of the embedded local Ray (``ray.address`` unset): the logical CPUs of all its actors together,
checked against ``ray.num_cpus`` before anything starts — TransferQueue's ``tq.init`` hangs silently when its actors
cannot be scheduled (docs/development.md). Pure: imports neither Ray nor torch."""

from __future__ import annotations

from typing import Any

CONTROLLER_ACTOR_CPUS = 1.0
TQ_CONTROLLER_CPUS = 1.0  # transferqueue asks 1 CPU for its controller ...
TQ_STORAGE_UNIT_CPUS = 1.0  # ... and 1 per storage unit (oversubscribed, tq.init hangs silently: docs/development.md)


def cpus_required(cfg: Any) -> float:
    """Logical CPUs every actor of ``cfg``'s job (an ``AppConfig``) asks for together, its spare trainer ranks too."""
    trainer, generation = cfg.trainer, cfg.generation
    return (
        TQ_CONTROLLER_CPUS
        + cfg.data_plane.storage_units * TQ_STORAGE_UNIT_CPUS
        + CONTROLLER_ACTOR_CPUS
        + (trainer.num_workers + trainer.spare_ranks) * trainer.num_cpus
        + generation.num_workers * generation.num_cpus
    )


def check_embedded_cpus(cfg: Any) -> None:
    """``ValueError`` naming every actor's share when ``cfg``'s job needs more logical CPUs than ``ray.num_cpus``."""
    need = cpus_required(cfg)
    if need <= cfg.ray.num_cpus:
        return
    trainer, generation, units = cfg.trainer, cfg.generation, cfg.data_plane.storage_units
    raise ValueError(
        f"the job cannot be scheduled on the embedded Ray: it needs {need:g} logical CPUs (TransferQueue controller "
        f"{TQ_CONTROLLER_CPUS:g} + data_plane.storage_units={units}: {units * TQ_STORAGE_UNIT_CPUS:g} + controller "
        f"actor {CONTROLLER_ACTOR_CPUS:g} + trainer.num_workers={trainer.num_workers}: "
        f"{trainer.num_workers * trainer.num_cpus:g} + trainer.spare_ranks={trainer.spare_ranks}: "
        f"{trainer.spare_ranks * trainer.num_cpus:g} + generation.num_workers={generation.num_workers}: "
        f"{generation.num_workers * generation.num_cpus:g}) but ray.num_cpus={cfg.ray.num_cpus}; lower those or "
        "raise ray.num_cpus"
    )
