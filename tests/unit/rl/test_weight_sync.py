"""The weight-sync seam (``sc_app.rl.weight_sync``): the push every caller shares (rank 0's weights to each worker,
every trainer rank taking part, a dead worker skipped only where asked, the version each worker holds), the one
choice of transport, and each transport's two ends (a trainer rank's sender, a vLLM engine's receiver) with the
engine dispatching through its receiver. Fake actor handles and a fake ``LLM`` stand in for Ray and vLLM (the real
ones: tests/integration/rl/hf/test_vllm_engine.py, tests/e2e/test_generation_restart.py, test_vllm_run.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")

from sc_app.config.app import ConfigError, load_config  # noqa: E402
from sc_app.rl.hf.vllm_engine import VLLMEngine, VLLMSettings  # noqa: E402
from sc_app.rl.hf.vllm_weights import WeightLoadExtension  # noqa: E402
from sc_app.rl.weight_sync.factory import transport_for  # noqa: E402
from sc_app.rl.weight_sync.nccl import (  # noqa: E402
    RECEIVE_METHOD,
    NcclReceiver,
    NcclSender,
    NcclTransport,
    NcclWeightsOffer,
    group_world_size,
    rank_offset,
)
from sc_app.rl.weight_sync.object_store import LOAD_METHOD, StateDictReceiver, StateDictSender  # noqa: E402
from sc_app.rl.weight_sync.push import PushResult, WeightSync  # noqa: E402
from tests.support.fake_workers import FakeActor  # noqa: E402


class Trainer(FakeActor):
    def __init__(self, rank: int, fail: BaseException | None = None) -> None:
        self._rank, self._fail, self._log = rank, fail, []

    def get_weights(self) -> dict[str, torch.Tensor] | None:
        self._log.append(("get_weights", None))
        if self._fail is not None:
            raise self._fail
        return {"w": torch.ones(2)} if self._rank == 0 else None


class Worker(FakeActor):
    def __init__(self, fail: BaseException | None = None) -> None:
        self._fail, self._log = fail, []

    def set_weights(self, weights: Any, version: int) -> int:
        if self._fail is not None:
            raise self._fail
        self._log.append(("set_weights", (weights, version)))
        return version


def test_a_push_gives_rank_0s_weights_to_every_worker_with_every_rank_taking_part() -> None:
    trainers, workers = [Trainer(0), Trainer(1)], [Worker(), Worker(), Worker()]
    sync = WeightSync(trainers)
    assert sync.held(workers[0]) is None and sync.is_stale(workers[0], 0)
    assert asyncio.run(sync.push(workers, 4)) == PushResult(4, reached=3)
    assert all(len(t.called("get_weights")) == 1 for t in trainers), "every rank takes part once per version"
    (first,) = workers[0].called("set_weights")
    assert first[1] == 4 and torch.equal(first[0]["w"], torch.ones(2))
    assert all(w.called("set_weights")[0][0] is first[0] for w in workers), "one object for every worker"
    assert [sync.held(w) for w in workers] == [4, 4, 4]
    assert not sync.is_stale(workers[1], 4) and sync.is_stale(workers[1], 5)


def test_the_other_ranks_part_is_awaited_and_its_error_raised() -> None:
    sync = WeightSync([Trainer(0), Trainer(1, fail=RuntimeError("gather failed on rank 1"))])
    with pytest.raises(RuntimeError, match="gather failed on rank 1"):
        asyncio.run(sync.push([Worker()], 1, skip_dead=True))


def test_a_dead_worker_is_skipped_and_forgotten_only_where_asked() -> None:
    alive, dead = Worker(), Worker()
    sync = WeightSync([Trainer(0)])
    asyncio.run(sync.push([alive, dead], 1))
    dead._fail = ray.exceptions.RayActorError()
    assert asyncio.run(sync.push([alive, dead], 2, skip_dead=True)) == PushResult(2, reached=1, skipped=(1,))
    assert sync.held(alive) == 2 and sync.held(dead) is None
    with pytest.raises(ray.exceptions.RayActorError):
        asyncio.run(sync.push([dead], 3))  # a replacement's push: its death is an error
    broken = Worker(fail=RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(sync.push([alive, broken], 4, skip_dead=True))
    assert sync.held(alive) == 4, "the workers that loaded the version hold it"


def test_a_blocking_push_waits_on_every_call_with_the_given_get() -> None:
    class Handle:
        def __init__(self, name: str) -> None:
            self.get_weights = self.set_weights = self
            self.name = name

        def remote(self, *args: Any) -> str:
            return f"{self.name}{args}"

    waited: list[list[Any]] = []
    sync = WeightSync([Handle("t0"), Handle("t1")])
    workers = [Handle("g0"), Handle("g1")]
    assert sync.push_blocking(workers, 3, get=waited.append) == PushResult(3, reached=2)
    assert waited == [["g0('t0()', 3)", "g1('t0()', 3)", "t1()"]], "workers get rank 0's ref; rank 1 is awaited"
    assert [sync.held(w) for w in workers] == [3, 3]

    def failing(refs: list[Any]) -> None:
        raise RuntimeError("a worker's load failed")

    with pytest.raises(RuntimeError, match="load failed"):
        sync.push_blocking(workers, 4, get=failing)
    assert [sync.held(w) for w in workers] == [3, 3], "nothing recorded for a version that did not land"


VLLM = ["model.backend=hf", "model.path=/m", "generation.engine=vllm", "grpo.old_logprobs=engine"]
GPUS = ["generation.num_gpus=1", "trainer.num_gpus=1"]


def test_the_transport_follows_the_engine_and_only_trainer_rank_0_sends_over_nccl() -> None:
    assert transport_for(load_config(None, [])).name == "object_store"
    assert transport_for(load_config(None, [*VLLM, *GPUS])).name == "object_store"
    nccl = transport_for(load_config(None, [*VLLM, *GPUS, "generation.num_workers=2", "generation.weight_sync=nccl"]))
    assert isinstance(nccl, NcclTransport) and nccl.name == "nccl"
    assert isinstance(nccl.sender(1), StateDictSender), "ranks other than 0 return their None as ever"
    sender = nccl.sender(0)
    assert isinstance(sender, NcclSender) and sender.world_size == 3 and sender.payload(None) is None
    assert [nccl.receiver(i).rank_offset for i in range(2)] == [1, 2]
    with pytest.raises(ConfigError, match=r"needs grpo\.old_logprobs=engine"):
        load_config(None, [*VLLM[:-1], *GPUS, "generation.weight_sync=nccl"])


def test_nccl_ranks_place_each_engines_workers_after_trainer_rank_0() -> None:
    assert group_world_size(num_engines=2, tensor_parallel_size=2) == 5
    assert [rank_offset(i, 2) for i in range(2)] == [1, 3]  # engine 0: ranks 1, 2; engine 1: ranks 3, 4
    assert NcclTransport(2, 2).receiver(1).rank_offset == 3


class FakeLLM:
    def __init__(self) -> None:
        self.rpcs: list[tuple[str, tuple[Any, ...]]] = []
        self.kwargs: list[dict[str, Any] | None] = []
        self.prefix_resets = 0

    def collective_rpc(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> list[int]:
        self.rpcs.append((method, args))
        self.kwargs.append(kwargs)
        return [7]

    def reset_prefix_cache(self) -> bool:
        self.prefix_resets += 1
        return True


def test_each_receiver_calls_its_own_method_of_the_worker_extension() -> None:
    sender = StateDictSender()
    weights = {"w": torch.zeros(1)}
    assert sender.payload(weights) is weights and sender.wait() is None
    llm = FakeLLM()
    got = StateDictReceiver().receive(llm, weights)
    assert got.tensors == 7 and dict(got.host_state()) == weights
    offer = NcclWeightsOffer("10.0.0.1", 1234, 3, (("w", "float32", (1,)),))
    got = NcclReceiver(3).receive(llm, offer)
    assert llm.rpcs == [(LOAD_METHOD, (weights,)), (RECEIVE_METHOD, (offer, 3))]
    assert llm.kwargs[0] == {"fast": True}, "the param map unless a caller asks for vLLM's reload"
    StateDictReceiver(fast=False).receive(llm, weights)
    assert llm.kwargs[-1] == {"fast": False}
    assert got.tensors == 7 and got.state is None
    with pytest.raises(RuntimeError, match=r"grpo\.old_logprobs=engine"):
        got.host_state()
    for method in (LOAD_METHOD, RECEIVE_METHOD):  # the names the receivers call exist on the extension
        assert callable(getattr(WeightLoadExtension, method))


def engine(receiver: Any, *, copy: torch.nn.Module | None) -> tuple[VLLMEngine, FakeLLM]:
    llm = FakeLLM()
    settings = VLLMSettings(model_path="/m", dtype="float32", seed=0, max_model_len=8, engine_logprobs=copy is None)
    return VLLMEngine(llm, settings, receiver=receiver, eos=[2], pad=0, logprob_model=copy), llm


def test_the_vllm_engine_loads_through_its_receiver_and_serves_the_version() -> None:
    copy, trained = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    state = {k: v.detach().clone() for k, v in trained.state_dict().items()}
    eng, llm = engine(StateDictReceiver(), copy=copy)
    eng.load_weights(state, 4)
    assert eng.version == 4 and [m for m, _ in llm.rpcs] == [LOAD_METHOD]
    assert llm.prefix_resets == 1, "KV blocks of the last version must not serve this one's prompts"
    assert torch.equal(copy.weight, trained.weight), "the log-prob copy gets the same version"

    offer = NcclWeightsOffer("10.0.0.1", 1234, 3, ())
    eng, llm = engine(NcclReceiver(1), copy=None)
    eng.load_weights(offer, 5)  # type: ignore[arg-type]
    assert eng.version == 5 and llm.rpcs == [(RECEIVE_METHOD, (offer, 1))]

    eng, llm = engine(NcclReceiver(1), copy=torch.nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="host copy"):
        eng.load_weights(offer, 6)  # type: ignore[arg-type]
    assert eng.version == 0, "a version whose copy did not load is not served"
