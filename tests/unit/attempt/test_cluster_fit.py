"""cluster_fit: after a node is gone, does the job still fit the nodes left — and if not, one line naming what."""

from __future__ import annotations

from sc_app.attempt.cluster_fit import Demand, held_cpus, job_demands, missing, unfit_line
from sc_app.config.app import AppConfig
from sc_app.config.embedded import cpus_required


def cfg(**sections: dict) -> AppConfig:
    return AppConfig.model_validate({"ray": {"address": "auto"}, **sections})


def test_the_demands_are_every_actor_the_setup_places() -> None:
    c = cfg(
        trainer={"num_workers": 2, "num_gpus": 1, "resources": {"trainer_node": 1}},
        generation={"num_workers": 1, "num_cpus": 2},
        data_plane={"storage_units": 2, "storage_node_resource": "tq_node"},
    )
    names = [d.name for d in job_demands(c)]
    assert names == [
        "TransferQueue controller",
        "storage unit 0",
        "storage unit 1",
        "controller actor",
        "trainer rank 0",
        "trainer rank 1",
        "generation worker 0",
    ]
    by = {d.name: d.resources for d in job_demands(c)}
    assert by["trainer rank 1"] == {"CPU": 1.0, "GPU": 1.0, "trainer_node": 1}
    assert by["generation worker 0"] == {"CPU": 2.0}, "zero-valued resources are not asked for"
    assert "tq_node" in by["storage unit 0"], "a storage unit needs a node with the storage resource"
    assert sum(d.resources.get("CPU", 0) for d in job_demands(c)) == cpus_required(c)


def test_spare_ranks_are_held_where_units_go_but_never_required_to_fit() -> None:
    c = cfg(trainer={"num_workers": 1, "spare_ranks": 1, "num_gpus": 1}, generation={"num_workers": 1})
    assert [d.name for d in job_demands(c)][-1] == "generation worker 0", "the fit check leaves spares out"
    with_spares = job_demands(c, spares=True)
    assert with_spares[-1].name == "spare trainer rank 0" and with_spares[-1].resources == {"CPU": 1.0, "GPU": 1.0}
    assert sum(d.resources.get("CPU", 0) for d in with_spares) == cpus_required(c)
    # one 6-CPU GPU node: the spare holds a CPU there too, so a unit is not counted on it
    node = {"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 6.0, "GPU": 2.0}}
    none = cfg(trainer={"num_workers": 1, "num_gpus": 1}, generation={"num_workers": 1})
    assert held_cpus(none, [node]) == {"gpu": 4.0}  # TQ controller, controller actor, trainer, generation
    assert held_cpus(c, [node]) == {"gpu": 5.0}, "and the spare"


def test_a_job_that_fits_leaves_nothing_missing() -> None:
    nodes = [{"CPU": 4.0}, {"CPU": 2.0, "GPU": 2.0, "trainer_node": 4.0}]
    c = cfg(trainer={"num_workers": 2, "num_gpus": 1, "resources": {"trainer_node": 1}})
    assert missing(job_demands(c), nodes) == []
    assert unfit_line(job_demands(c), nodes) is None


def test_what_a_lost_node_took_is_named_with_what_is_left() -> None:
    c = cfg(trainer={"num_workers": 2, "num_gpus": 1})
    left = [{"CPU": 8.0, "GPU": 1.0, "node:10.0.0.1": 1.0, "memory": 1e9}]
    line = unfit_line(job_demands(c), left)
    assert line is not None
    assert "trainer rank" in line and "GPU=1" in line and "live nodes: CPU=8, GPU=1" in line
    assert "memory" not in line and "node:" not in line, "Ray's built-in resources are noise in the line"
    assert unfit_line(job_demands(c), []) is not None and "live nodes: none" in unfit_line(job_demands(c), [])  # type: ignore[operator]
    two = [{"CPU": 8.0}, {"CPU": 3.0, "gen_node": 4.0}]
    assert unfit_line(job_demands(c), two) == unfit_line(job_demands(c), two[::-1]), "the nodes in a stable order"


def test_packing_is_per_node_not_by_cluster_totals() -> None:
    """Two 1-GPU nodes hold 2 GPUs in all, but not one 2-GPU worker."""
    big = [Demand("trainer rank 0", {"CPU": 1, "GPU": 2})]
    assert missing(big, [{"CPU": 4, "GPU": 1}, {"CPU": 4, "GPU": 1}]) == big
    assert missing(big, [{"CPU": 4, "GPU": 2}]) == []


def test_largest_first_does_not_strand_a_big_actor_behind_small_ones() -> None:
    demands = [Demand("small", {"CPU": 1}), Demand("big", {"CPU": 3})]
    assert missing(demands, [{"CPU": 3}, {"CPU": 1}]) == [], "small first would take the big node's room"


def test_the_cpus_the_other_actors_hold_per_node_leave_the_units_out() -> None:
    """Where the storage units are expected to find room: the job's other actors packed as ``missing`` packs them
    (largest first), the driver's node first. The 8 GPU trainer ranks fill the GPU node's 8 CPUs; TransferQueue's
    controller, the controller actor and the generation worker (1 CPU each) hold 3 of the head's 6; a dead node
    holds nothing; the units are not counted."""
    c = cfg(trainer={"num_workers": 8, "num_gpus": 1}, data_plane={"storage_units": 2})
    nodes = [
        {"NodeID": "gpu", "Alive": True, "Resources": {"CPU": 8.0, "GPU": 8.0}},
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 6.0}},
        {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 64.0}},
    ]
    held = held_cpus(c, nodes, first="head")
    assert held == {"gpu": 8.0, "head": 3.0}, held
    assert held_cpus(c, nodes, first="gpu") == {"gpu": 8.0, "head": 3.0}, "GPU actors first: they fit only there"
