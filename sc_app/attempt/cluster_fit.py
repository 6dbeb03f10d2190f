"""Does the job still fit the cluster? The question an in-job restore asks after a node is gone.

Every actor the job places is one ``Demand`` (its Ray resources); ``missing`` packs them onto the nodes' total
resources, largest first (first fit decreasing, what Ray's scheduler approximates for a fresh job), and names what
does not fit. Totals, not availability: the job's own actors were torn down before the question is asked, so the
nodes' totals are what the rebuilt job can have. Pure: no Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sc_app.config.embedded import CONTROLLER_ACTOR_CPUS, TQ_CONTROLLER_CPUS, TQ_STORAGE_UNIT_CPUS


@dataclass(frozen=True)
class Demand:
    """One actor of the job and the resources it asks Ray for (``CPU``, ``GPU``, custom names)."""

    name: str
    resources: dict[str, float] = field(default_factory=dict)


def job_demands(cfg: Any, units: bool = True, spares: bool = False) -> list[Demand]:
    """The actors ``setup_single_controller`` places for ``cfg`` (an ``AppConfig``), each with its resources;
    without the storage units when ``units`` is false; with the spare trainer ranks (``trainer.spare_ranks``: a
    trainer rank's resources each, never required for the job to fit) when ``spares`` is true."""
    out = [Demand("TransferQueue controller", {"CPU": TQ_CONTROLLER_CPUS})]
    unit_needs = {"CPU": TQ_STORAGE_UNIT_CPUS}
    if cfg.data_plane.storage_node_resource:
        unit_needs[cfg.data_plane.storage_node_resource] = 0.001  # the node must have it; Ray checks presence
    out += [Demand(f"storage unit {k}", dict(unit_needs)) for k in range(cfg.data_plane.storage_units if units else 0)]
    out.append(Demand("controller actor", {"CPU": CONTROLLER_ACTOR_CPUS}))
    groups = [(cfg.trainer, "trainer rank", cfg.trainer.num_workers)]
    groups += [(cfg.generation, "generation worker", cfg.generation.num_workers)]
    groups += [(cfg.trainer, "spare trainer rank", cfg.trainer.spare_ranks)] if spares else []
    for group, label, count in groups:
        needs = {"CPU": group.num_cpus, "GPU": group.num_gpus, **group.resources}
        out += [Demand(f"{label} {i}", {k: v for k, v in needs.items() if v > 0}) for i in range(count)]
    return out


def missing(demands: list[Demand], nodes: list[dict[str, float]]) -> list[Demand]:
    """The demands that do not fit ``nodes`` (each node's total resources) once the others are placed, largest
    (GPU, then CPU, then the rest) first; empty when the job fits."""
    return [demand for demand, node in _packed(demands, [dict(n) for n in nodes]) if node is None]


def held_cpus(cfg: Any, nodes: list[dict[str, Any]], first: str | None = None) -> dict[str, float]:
    """The CPUs the job's actors other than its storage units are expected to hold on each alive node (``ray.nodes()``
    entries; node id → CPUs): ``missing``'s packing over the nodes' totals, the driver's node (``first``, where Ray's
    default scheduling starts too) tried first. An estimate — Ray places those actors itself — for where the
    storage units, which TransferQueue pins to their nodes, have room (``sc_app.data_plane.tq_placement``)."""
    alive = sorted((n for n in nodes if n.get("Alive")), key=lambda n: (n["NodeID"] != first, n["NodeID"]))
    others = job_demands(cfg, units=False, spares=True)
    held = {n["NodeID"]: 0.0 for n in alive}
    for demand, node in _packed(others, [dict(n.get("Resources", {})) for n in alive]):
        if node is not None:
            held[alive[node]["NodeID"]] += demand.resources.get("CPU", 0.0)
    return held


def _packed(demands: list[Demand], free: list[dict[str, float]]) -> list[tuple[Demand, int | None]]:
    """Each demand, largest first, with the index of the first node of ``free`` it fits on (taken from it), or None."""
    out: list[tuple[Demand, int | None]] = []
    for demand in sorted(demands, key=_size, reverse=True):
        fits = (i for i, n in enumerate(free) if all(n.get(k, 0.0) + 1e-9 >= v for k, v in demand.resources.items()))
        node = next(fits, None)
        if node is not None:
            for k, v in demand.resources.items():
                free[node][k] = free[node].get(k, 0.0) - v
        out.append((demand, node))
    return out


def unfit_line(demands: list[Demand], nodes: list[dict[str, float]]) -> str | None:
    """``describe`` of what does not fit, or None when everything does."""
    left = missing(demands, nodes)
    return describe(left, nodes) if left else None


def describe(left: list[Demand], nodes: list[dict[str, float]]) -> str:
    """One line: what does not fit (each actor and its resources) and what the live nodes have."""
    wants = ", ".join(f"{d.name} ({_fmt(d.resources)})" for d in left)
    have = "; ".join(sorted(_fmt({k: v for k, v in n.items() if not _is_builtin(k)}) for n in nodes))  # stable
    return f"the cluster no longer fits the job: no node has room for {wants} (live nodes: {have or 'none'})"


def _size(demand: Demand) -> tuple[float, float, float]:
    r = demand.resources
    return (r.get("GPU", 0.0), r.get("CPU", 0.0), sum(v for k, v in r.items() if k not in ("CPU", "GPU")))


def _is_builtin(name: str) -> bool:
    return name.startswith("node:") or name in ("memory", "object_store_memory") or name.startswith("accelerator_type")


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(resources.items())) or "nothing"
