"""The pure verdicts of ``bench/chaos.py --in-job`` (bench/chaos_in_job.py): which kills must show as which fault
events, what a late kill is, and the kill plan's bounds. The bench itself runs real processes (not in the suite)."""

from __future__ import annotations

import random

from bench.chaos_in_job import Shape, check_faults, plan_kills, recovery_by_fault


def fault(kind: str, outcome: str = "recovered", **extra: object) -> dict[str, object]:
    return {"fault": kind, "outcome": outcome, "prompts_lost": 0, "prompts_duplicated": 0, "recovery_s": 1.0, **extra}


def test_every_kill_needs_a_recovered_fault_event_of_its_kind() -> None:
    shape = Shape(60, 2, ["trainer", "storage"])
    done = ["trainer@5", "storage@9"]
    assert check_faults([fault("trainer.worker"), fault("data_plane.storage")], shape, done) == []
    assert check_faults([fault("trainer.worker")], shape, done) == [
        "1 kills of storage, 0 'data_plane.storage' fault events"
    ]
    failed = check_faults([fault("trainer.worker", "failed", error="x"), fault("data_plane.storage")], shape, done)
    assert failed == ["fault trainer.worker: failed (x)"]


def test_a_late_kill_is_not_owed_an_event_but_lost_prompts_always_fail() -> None:
    shape = Shape(60, 1, ["generation"])
    assert check_faults([], shape, ["generation@late"]) == []
    assert check_faults([fault("generation.worker", prompts_lost=2)], shape, ["generation@7"]) == [
        "fault generation.worker lost or duplicated prompts"
    ]


def test_dp_must_fire_and_a_storage_kill_does_not_count_as_a_data_plane_call() -> None:
    shape = Shape(60, 0, ["dp"])
    assert check_faults([fault("data_plane.put")], shape, []) == []
    assert check_faults([fault("data_plane.storage")], shape, [])[0].startswith("dp chosen but no data-plane call")


def test_kills_land_in_the_first_two_thirds_of_the_run_in_step_order() -> None:
    plan = plan_kills(random.Random(3), Shape(60, 50, ["generation", "tq-controller", "dp"]))
    assert len(plan) == 50 and [s for s, _, _ in plan] == sorted(s for s, _, _ in plan)
    assert all(3 <= s <= 40 and k in ("generation", "tq-controller") for s, _, k in plan)
    assert plan_kills(random.Random(3), Shape(60, 5, ["dp"])) == []


def test_recovery_seconds_are_summed_up_per_fault_kind() -> None:
    faults = [fault("a", recovery_s=1.0), fault("a", recovery_s=3.0), fault("b", recovery_s=0.5)]
    assert recovery_by_fault(faults) == {"a": {"median": 2.0, "max": 3.0}, "b": {"median": 0.5, "max": 0.5}}


def test_the_restore_table_counts_restores_per_kind_and_engine_starts_per_path() -> None:
    from bench.chaos_compare import engine_starts, restores_by_kind

    warm = [
        fault("trainer.worker", restored_step=2, recovery_s=4.0, path="warm", restarted=["trainer rank 0"]),
        fault("trainer.worker", restored_step=4, recovery_s=6.0, path="warm", restarted=["trainer rank 0"]),
        fault("controller", restored_step=6, recovery_s=3.0, path="warm", restarted=["generation worker 0"]),
        fault("generation.worker", recovery_s=9.0),  # a replaced worker, not a restore
        fault("data_plane.storage", "interrupted", restored_step=8, recovery_s=1.0, path="warm"),
    ]
    assert restores_by_kind(warm) == {
        "controller": {"median": 3.0, "max": 3.0, "n": 1},
        "trainer.worker": {"median": 5.0, "max": 6.0, "n": 2},
    }
    assert engine_starts(warm, engines=2) == 1, "a warm restore starts only the engines it names"
    full = [fault("trainer.worker", restored_step=2, path="full"), fault("controller", restored_step=4, path="full")]
    assert engine_starts(full, engines=2) == 4, "a full rebuild starts every engine"
    assert check_faults(warm, Shape(60, 1, ["trainer"]), ["trainer@5"]) == [], "interrupted: covered by the next"


def test_each_kills_every_kind_once_in_the_order_given_within_the_span() -> None:
    shape = Shape(24, 3, ["trainer", "storage", "tq-controller", "controller", "dp"], each=True)
    plan = plan_kills(random.Random(1), shape)
    assert [k for _, _, k in plan] == ["trainer", "storage", "tq-controller", "controller"]
    at = [s for s, _, _ in plan]
    assert at == sorted(set(at)) and at[0] == 3 and at[-1] <= 16, "spread, distinct steps, first two thirds"
