"""The trace rules of tests/support/restart.py that the restart tests and ``bench/chaos.py --in-job`` rely on:
the kept history across a restore, prompts trained twice or lost, and the version a restarted worker served."""

from __future__ import annotations

from typing import Any

from tests.support.restart import generation_restart_problems, kept_history, prompt_problems


def start(step: int) -> dict[str, Any]:
    return {"ev": "start", "step": step}


def train(step: int, *prompts: int) -> dict[str, Any]:
    return {"ev": "train", "step": step, "prompts": list(prompts)}


def test_steps_after_the_restored_one_are_redone_not_counted_twice() -> None:
    # 1..3 trained, restored from step 2 (in-job or a process restart): step 3's prompts are trained again
    events = [start(0), train(1, 0), train(2, 1), train(3, 2), start(2), train(3, 2), train(4, 3)]
    assert kept_history(events) == ([0, 1, 2, 3], [])
    assert prompt_problems(events, next_index=4, held=set()) == []


def test_a_prompt_trained_twice_in_the_kept_history_is_reported() -> None:
    events = [start(0), train(1, 0), train(2, 1), start(2), train(3, 1)]
    assert prompt_problems(events, next_index=2, held=set()) == ["prompts trained twice: [1]"]


def test_a_prompt_neither_trained_dropped_nor_held_is_lost() -> None:
    events = [start(0), train(1, 0), {"ev": "drop_stale", "prompts": [1]}, train(2, 3)]
    assert prompt_problems(events, next_index=5, held={4}) == ["prompts lost (neither trained, dropped nor held): [2]"]


def test_a_drop_counts_with_the_step_trained_after_it() -> None:
    events = [start(0), train(1, 0), {"ev": "drop_stale", "prompts": [1]}, train(2, 2), start(1), train(2, 2)]
    trained, dropped = kept_history(events)
    assert trained == [0, 2] and dropped == []  # the drop went with step 2, which was redone


def test_a_restarted_worker_must_serve_at_least_the_version_training_was_at() -> None:
    events = [
        start(0),
        {"ev": "issue", "prompts": [0], "worker": 0},
        train(1, 9),
        train(2, 8),
        {"ev": "give_back", "prompts": [0], "worker": 0},
        {"ev": "generation_restart", "worker": 0, "version": 2},
        {"ev": "issue", "prompts": [0], "worker": 0},
        {"ev": "rollout", "prompts": [0], "worker": 0, "version": 2},
    ]
    assert generation_restart_problems(events) == []
    stale = [dict(e, version=1) if e["ev"] in ("generation_restart", "rollout") else e for e in events]
    assert generation_restart_problems(stale) == ["worker 0 restarted at version 1, training was at 2"]
    served_old = [dict(e, version=1) if e["ev"] == "rollout" else e for e in events]
    assert generation_restart_problems(served_old) == ["worker 0 served version 1 after restarting at 2"]
    not_reissued = [e for e in events if not (e["ev"] == "issue" and e is events[6])]
    assert generation_restart_problems(not_reissued) == ["given-back prompts [0] were not issued again"]
