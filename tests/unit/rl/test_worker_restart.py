"""policy.worker_restart and PromptLoader.give_back: a dead generation worker's prompts come back exactly once, its
replacement is bounded per worker and time window, and a dead worker does not fail a weight sync. Pure logic with
fake actor handles; the real process kill is ``tests/e2e/test_in_job_restore.py``."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

ray = pytest.importorskip("ray")

from sc_app.config.app import load_config  # noqa: E402
from sc_app.progress import FaultRecord  # noqa: E402
from sc_app.rl.loader import PromptLoader  # noqa: E402
from sc_app.rl.worker_restart import GenerationSupervisor, GenerationWorkerFailed, RestartBudget  # noqa: E402


def test_give_back_reissues_pending_prompts_first_and_only_once() -> None:
    loader = PromptLoader()
    taken = [loader.take() for _ in range(4)]  # 0 1 2 3
    loader.settled(1)
    assert loader.give_back([1, 2, 3]) == [2, 3], "1 was committed: it never comes back"
    assert loader.give_back([2, 3]) == [], "given back once: no longer pending"
    assert [loader.take() for _ in range(3)] == [2, 3, 4]
    assert loader.pending == {0, 2, 3, 4} and taken == [0, 1, 2, 3]
    assert loader.state_dict()["reissue"] == [0, 2, 3, 4]


def test_the_restart_budget_counts_per_worker_within_the_window() -> None:
    budget = RestartBudget(max_restarts=2, window_s=10.0)
    assert budget.allow(0, 0.0) and budget.allow(0, 5.0)
    assert not budget.allow(0, 9.0), "a third restart within 10 s"
    assert budget.allow(1, 9.0), "another worker has its own budget"
    assert budget.allow(0, 10.5), "the first restart left the window"
    assert not RestartBudget(0, 10.0).allow(0, 0.0)


class Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args)

        return asyncio.ensure_future(call())


class Worker:
    def __init__(self, dead: bool = False) -> None:
        self.dead = dead
        self.weights: list[int] = []
        self.generate = Method(self._generate)
        self.set_weights = Method(self._set_weights)

    def _check(self) -> None:
        if self.dead:
            raise ray.exceptions.RayActorError()

    def _generate(self, idxs: list[int]) -> str:
        self._check()
        return f"rollout of {idxs} at {self.weights[-1] if self.weights else None}"

    def _set_weights(self, ref: Any, version: int) -> int:
        self._check()
        self.weights.append(version)
        return version


def supervisor(workers: list[Worker], restarts: int = 1) -> tuple[GenerationSupervisor, dict[str, Any]]:
    cfg = load_config(None, [f"generation.max_restarts={restarts}", "generation.restart_window_s=60"])
    seen: dict[str, Any] = {"given": [], "faults": [], "trace": [], "version": 7}

    async def give_back(idxs: list[int]) -> None:
        seen["given"].append(list(idxs))

    sup = GenerationSupervisor(
        cfg=cfg,
        cfg_json="{}",
        dataset_sha256=None,
        generators=workers,  # type: ignore[arg-type]
        trainers=[],
        version=lambda: seen["version"],
        step=lambda: 3,
        give_back=give_back,
        on_fault=seen["faults"].append,
        trace=lambda **ev: seen["trace"].append(ev),
    )

    async def replace(index: int) -> int:  # what _replace does, without Ray: a new worker with the weights
        fresh = Worker()
        fresh.weights.append(seen["version"])
        workers[index] = fresh
        return seen["version"]

    sup._replace = replace  # type: ignore[method-assign]
    return sup, seen


def test_a_dead_worker_gives_its_prompts_back_and_is_replaced_with_current_weights() -> None:
    workers = [Worker(dead=True)]
    sup, seen = supervisor(workers)
    assert asyncio.run(sup.generate(0, [4, 5])) is None
    assert seen["given"] == [[4, 5]]
    assert [e["ev"] for e in seen["trace"]] == ["give_back", "generation_restart"]
    assert seen["trace"][1]["version"] == 7
    (fault,) = seen["faults"]
    assert isinstance(fault, FaultRecord) and fault.kind == "generation.worker" and fault.outcome == "recovered"
    assert fault.step == 3 and fault.rollouts_regenerated == 2 * 8 and fault.prompts_lost == 0
    assert asyncio.run(sup.generate(0, [4, 5])) == "rollout of [4, 5] at 7", "the new worker serves, current weights"


def test_past_the_budget_the_run_stops_with_one_line_naming_worker_and_prompts() -> None:
    workers = [Worker(dead=True)]
    sup, seen = supervisor(workers, restarts=1)
    asyncio.run(sup.generate(0, [1]))
    workers[0].dead = True  # the replacement dies too (a poisoned prompt)
    with pytest.raises(GenerationWorkerFailed, match=r"worker 0 died more than generation.max_restarts=1 .*\[1\]"):
        asyncio.run(sup.generate(0, [1]))
    assert seen["given"] == [[1], [1]], "the prompts go back to the loader even when the run stops"


class Trainer:
    def __init__(self) -> None:
        self.get_weights = Method(lambda: "weights")


def test_a_weight_sync_skips_a_dead_worker_but_not_other_errors() -> None:
    workers = [Worker(), Worker(dead=True)]
    sup, _ = supervisor(workers)
    sup.weights.trainers = [Trainer()]
    assert asyncio.run(sup.push_weights(8)).skipped == (1,)
    assert workers[0].weights == [8]

    def broken(ref: Any, version: int) -> int:
        raise RuntimeError("out of memory")

    workers[0].set_weights = Method(broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(sup.push_weights(9))


def test_a_replacement_gets_the_current_weights_before_it_joins_and_a_newer_version_too(monkeypatch: Any) -> None:
    import sc_app.rl.generation as generation

    seen: dict[str, Any] = {"version": 7}
    workers: list[Any] = [Worker(dead=True)]
    dead = workers[0]

    class Fresh(Worker):
        def _set_weights(self, ref: Any, version: int) -> int:
            assert self not in workers, "a weights version reaches the replacement before it is in the list"
            seen["version"] = 8  # training published a newer version while this one was sent
            return super()._set_weights(ref, version)

    fresh = Fresh()
    fresh.setup = Method(lambda sha: None)

    class Spawn:
        @staticmethod
        def options(**kw: Any) -> Any:
            return type("Opts", (), {"remote": staticmethod(lambda cfg_json, index: fresh)})

    monkeypatch.setattr(generation, "GenerationWorker", Spawn)
    cfg = load_config(None, [])
    sup = GenerationSupervisor(
        cfg=cfg, cfg_json="{}", dataset_sha256=None, generators=workers, trainers=[Trainer()],
        version=lambda: seen["version"], step=lambda: 1, give_back=lambda idxs: asyncio.sleep(0),
        on_fault=lambda f: None, trace=lambda **ev: None,
    )  # fmt: skip
    sup.weights._held[dead] = 6
    assert asyncio.run(sup._replace(0)) == 8
    assert fresh.weights == [7, 8] and workers == [fresh]
    assert sup.weights.held(fresh) == 8 and sup.weights.held(dead) is None, "the dead worker is forgotten"


def test_a_replacement_that_cannot_be_placed_stops_the_run_instead_of_waiting_forever(monkeypatch: Any) -> None:
    import sc_app.rl.generation as generation
    from sc_app.rl import worker_restart

    killed: list[Any] = []

    class Pending:  # what Ray gives for an actor no node has room for: its calls never complete
        def __init__(self) -> None:
            self.setup = Method(lambda sha: None)
            self.setup.remote = lambda sha: asyncio.get_running_loop().create_future()  # type: ignore[method-assign]

    class NoRoom:
        @staticmethod
        def options(**kw: Any) -> Any:
            return type("Opts", (), {"remote": staticmethod(lambda cfg_json, index: Pending())})

    monkeypatch.setattr(generation, "GenerationWorker", NoRoom)
    monkeypatch.setattr(worker_restart, "START_TIMEOUT_S", 0.05)
    monkeypatch.setattr(ray, "kill", killed.append)
    workers = [Worker(dead=True)]
    cfg = load_config(None, ["generation.resources={gpu_node: 1}"])
    sup = GenerationSupervisor(
        cfg=cfg, cfg_json="{}", dataset_sha256=None, generators=workers, trainers=[], version=lambda: 1,
        step=lambda: 1, give_back=lambda idxs: asyncio.sleep(0), on_fault=lambda f: None, trace=lambda **ev: None,
    )  # fmt: skip
    with pytest.raises(GenerationWorkerFailed, match=r"did not start within 0.05s .*'gpu_node': 1.0"):
        asyncio.run(sup.generate(0, [3]))
    assert len(killed) == 1, "the pending replacement is cancelled"


def test_a_replacement_that_dies_as_it_starts_is_one_more_death_not_a_pump_failure() -> None:
    """Issue 31 B: kill a generation worker, then its replacement as it starts — a fault event per death, replaced
    again within the budget, never ``rollout pump failed``."""
    workers = [Worker(dead=True)]
    sup, seen = supervisor(workers, restarts=3)
    starts = []

    async def replace(index: int) -> int:
        starts.append(index)
        if len(starts) == 1:  # the first replacement dies during its setup
            raise ray.exceptions.RayActorError()
        workers[index] = Worker()
        workers[index].weights.append(seen["version"])
        return seen["version"]

    sup._replace = replace  # type: ignore[method-assign]
    assert asyncio.run(sup.generate(0, [4, 5])) is None
    assert starts == [0, 0] and seen["given"] == [[4, 5]], "the prompts went back once"
    first, second = seen["faults"]
    assert first.outcome == second.outcome == "recovered" and "replacement died as it started" in first.error
    assert first.rollouts_regenerated == 0 and second.rollouts_regenerated == 2 * 8
    assert asyncio.run(sup.generate(0, [4, 5])) == "rollout of [4, 5] at 7"


def test_a_replacement_dying_past_the_budget_stops_with_one_line() -> None:
    workers = [Worker(dead=True)]
    sup, seen = supervisor(workers, restarts=2)

    async def always_dies(index: int) -> int:
        raise ray.exceptions.RayActorError()

    sup._replace = always_dies  # type: ignore[method-assign]
    with pytest.raises(GenerationWorkerFailed, match=r"worker 0 died more than generation\.max_restarts=2"):
        asyncio.run(sup.generate(0, [1]))
    assert len(seen["faults"]) == 2, "each death of a replacement had its event"


def test_a_rollout_of_another_epoch_is_refused_and_its_prompts_given_back() -> None:
    """The controller side of fencing: a reply from before a warm reset (stamped with the old epoch) is never
    committed."""
    from sc_app.rl.backend import Rollout

    class Stale(Worker):
        def _generate(self, idxs: list[int], epoch: int | None = None) -> Any:  # type: ignore[override]
            return Rollout({}, version=3, epoch=1)

    sup, seen = supervisor([Stale()])
    sup.epoch = 2
    assert asyncio.run(sup.generate(0, [8, 9])) is None
    assert sup.refused == 1 and seen["given"] == [[8, 9]] and not seen["faults"]
