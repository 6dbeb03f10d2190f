"""The pure figures of the in-job restore benches (bench/restore_figures.py): the budget "restore ≤ one actor's
start + the bundle at raw disk speed + 50%" and its verdicts, resume → first token read from a run's trace, and
the engine ratio's verdict. The benches themselves run real processes (not in the suite)."""

from __future__ import annotations

import math

from bench.restore_figures import (
    Budget,
    budget_verdicts,
    first_rollout_after,
    first_rollouts,
    kind_line,
    kind_verdicts,
    ratio_verdict,
)


def test_the_budget_is_one_and_a_half_times_an_actor_start_plus_the_raw_read() -> None:
    budget = Budget(actor_start_s=2.0, bundle_bytes=4 * 2**20, raw_read_s=0.5)
    assert budget.seconds == 3.75 and budget.read_mib_s == 8.0
    verdicts = budget_verdicts({"trainer.worker": {"median": 3.7}, "controller": {"median": 3.8}}, budget)
    assert [(v.kind, v.met) for v in verdicts] == [("controller", False), ("trainer.worker", True)]
    assert verdicts[0].line().endswith("MISSED") and verdicts[1].line().endswith("met")


def test_each_kind_is_held_to_the_start_of_its_own_actor_plus_the_raw_read() -> None:
    budget = Budget(1.0, 2**20, 0.5, {"trainer.worker": 2.5, "controller": 1.5})
    assert budget.of_kind("trainer.worker") == 4.5 and budget.of_kind("controller") == 3.0
    assert budget.of_kind("data_plane.storage") is None and budget.seconds == 2.25, "the bare actor's is kept"
    restores = {"trainer.worker": {"median": 4.4}, "controller": {"median": 3.1}, "data_plane.storage": {"median": 1}}
    verdicts = kind_verdicts(restores, budget)
    assert [(v.kind, v.limit_s, v.met) for v in verdicts] == [("controller", 3.0, False), ("trainer.worker", 4.5, True)]
    assert [v.met for v in budget_verdicts(restores, budget)] == [False, True, False], "the bare budget: 2.25 s"
    assert kind_line(budget).startswith("start of one actor of the kind that died (median): controller 1.5 s, ")


def test_resume_to_first_token_counts_from_each_restores_start_to_the_next_rollout() -> None:
    events = [
        {"ev": "start", "t": 0.0},  # the run's own start: not a restore
        {"ev": "rollout", "t": 5.0},
        {"ev": "train", "t": 6.0},
        {"ev": "start", "t": 20.0},
        {"ev": "rollout", "t": 21.5},
        {"ev": "rollout", "t": 22.0},
        {"ev": "start", "t": 30.0},  # a restore nothing was served after
    ]
    assert first_rollouts(events) == [1.5, None]
    assert first_rollout_after(events, 10.0) == 11.5, "from the kill to the first rollout of the job after it"
    assert first_rollout_after(events, 4.0) == 17.5, "a rollout of the job that was killed does not count"
    assert first_rollout_after(events, 31.0) is None


def test_the_ratio_verdict_says_met_or_missed() -> None:
    assert ratio_verdict("x", 3.0, 2.0, 2.0).endswith("= 1.50x (target <= 2x) met")
    assert ratio_verdict("x", 5.0, 2.0, 2.0).endswith("MISSED")
    assert "inf" in ratio_verdict("x", 1.0, 0.0, 2.0) and math.isinf(Budget(1.0, 1, 0.0).read_mib_s)


def test_the_engine_bench_verdicts_count_vllm_engine_starts_and_compare_first_tokens() -> None:
    from bench.in_job_engines import EngineRun, Restore, table, verdicts

    def run(engine: str, path: str, starts: int, first: float) -> EngineRun:
        r = Restore("trainer", "trainer.worker", path, 4.0, starts, [], first, first + 4.0)
        return EngineRun(engine, path, [r], [], 60.0, 1.0)

    warm = verdicts([run("hf", "warm", 0, 1.0), run("vllm", "warm", 0, 1.5)])
    assert warm[0] == "warm: vLLM engine starts in 1 restores: 0 met"
    assert warm[1].startswith("warm: resume -> first token, vLLM vs HF (median): 1.50 s vs 1.00 s = 1.50x")
    assert warm[1].endswith("met") and warm[2].endswith("met")
    full = verdicts([run("hf", "full", 1, 1.0), run("vllm", "full", 1, 30.0)])
    assert full[0].endswith(": 1 (the full rebuild's cost)") and full[1].endswith("MISSED")
    assert verdicts([run("vllm", "warm", 1, 1.0)]) == ["warm: vLLM engine starts in 1 restores: 1 MISSED"]
    assert table([run("vllm", "warm", 0, 1.5)], ["trainer"])[2] == "| trainer.worker | 4.0 / 0 / 1.5 / 5.5 |"
    failed = EngineRun("vllm", "full", [], ["exit 1"], 60.0, 1.0)
    assert verdicts([run("hf", "full", 1, 1.0), failed]) == [
        "full: vLLM: no restore measured (the run failed before its first)"
    ], "a run without restores is not a verdict of 0 engine starts, nor a ratio"
