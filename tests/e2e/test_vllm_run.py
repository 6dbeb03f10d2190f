"""End to end with the vLLM engine: ``sc-app run --set model.backend=hf --set generation.engine=vllm`` in
subprocesses (real Ray, real TransferQueue, a real vLLM CPU engine inside the generation worker) on a tiny random
Llama built here (hidden 128, 2 heads → head_dim 64, float32) and a task it can learn (reward: the share of
completion words that are "7").

One checkpoint directory, three runs (each starts one engine, A two):
  A. fresh; the reward rises; its generation worker (with the engine) is SIGKILLed by PID after step 3 and replaced
     in-job (one more engine start); A is SIGKILLed once a bundle exists and training went past it;
  B. resumes A's newest bundle; stopped with ``sc-app stop`` once it saved a newer one (exit 143);
  C. resumes B's stop bundle and finishes.
Each resume restores the bundle's policy bit for bit, hands out prompts from the bundle's loader place, and its
engine serves the bundle's weights version from its first generate call on. Bundles hold nothing of vLLM.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import dataclass

import pytest
import torch

from sc_app.observe.reader import read_history
from tests.support.cli import InProcess
from tests.support.hf import HfWorld, hf_world, make_model_dir, policy_oracle
from tests.support.proc import (
    Finished,
    actor_pids,
    kill_session,
    kill_when,
    past_a_new_bundle,
    sc_app,
    start_logged,
    step_bundles,
    trace_runs,
    trained_prompts,
    wait_for,
)
from tests.support.restart import generation_restart_problems, restarted_and_trained, trained_steps
from tests.support.vllm_host import TINY_LLAMA

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 600
LR = 2e-2
BUNDLE_FILES = re.compile(r"(policy/.+|train_dataloader\.pt|replay_buffer_metadata\.pt|data_plane/.+|streams?/.+)")
SEVENS = "def score(*, prompt, completion, answer):\n    return completion.split().count('7') / 4.0\n"


@dataclass
class Runs:
    a_log: str
    a_bundle: int  # newest bundle when A was killed
    b_log: str
    b_bundle: int  # the bundle B's stop cut
    c: Finished


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> HfWorld:
    base = tmp_path_factory.mktemp("vllm-e2e")
    return hf_world(
        base,
        model=make_model_dir(base / "model", **TINY_LLAMA),
        rows=[{"prompt": f"what is {a} + {b} ?", "answer": str(a + b)} for a in range(3) for b in range(4)],
        reward=("sevens", SEVENS),
        lr=LR,
        settings=("generation.engine=vllm", "generation.max_model_len=256"),
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )


@pytest.fixture(scope="module")
def runs(world: HfWorld) -> Runs:
    world.clear_runs()  # a rerun (Ray did not start in time) begins again on an empty directory
    a_log = world.base / "run_a.log"
    a = start_logged(*world.run_args(10_000), log=a_log, env=world.env)
    try:
        wait_for(lambda: trained_steps(world.trace, 0) >= 3, RUN_TIMEOUT, "run A's third step", a)
        (victim,) = actor_pids(a.pid, "GenerationWorker")  # the vLLM engine's worker dies mid-run: replaced in-job
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: restarted_and_trained(world.trace, 0), RUN_TIMEOUT, "run A's new generation worker", a)
    except BaseException:
        kill_session(a.pid)
        raise
    kill_when(lambda: past_a_new_bundle(world.trace, 0, 8), a, RUN_TIMEOUT, "run A past a bundle >= step 8", log=a_log)
    a_bundle = max(step_bundles(world.ckpt))
    b_log = world.base / "run_b.log"
    b = start_logged(*world.run_args(10_000), log=b_log, env=world.env)
    try:
        wait_for(lambda: past_a_new_bundle(world.trace, 1, a_bundle + 2), RUN_TIMEOUT, "run B past a new bundle", b)
        stopped = sc_app("stop", "--checkpoint-dir", str(world.ckpt), "--wait", "240", timeout=300)
        assert stopped.rc == 0 and "stopped: run" in stopped.out, stopped.out
        assert b.wait(timeout=60) == 143
    finally:
        kill_session(b.pid)
    b_bundle = max(step_bundles(world.ckpt))
    c = world.sc_app(*world.run_args(b_bundle + 2), timeout=RUN_TIMEOUT)
    assert c.rc == 0, c.out[-4000:]
    return Runs(a_log.read_text(), a_bundle, b_log.read_text(), b_bundle, c)


def test_the_reward_rises(world: HfWorld, runs: Runs) -> None:
    """Run A's steps up to the bundle it was killed past: logged by A, or, where A's log was behind at the SIGKILL,
    written by B from A's bundles (``recovered``): every one of them is in the run log, once each."""
    records = [json.loads(line) for line in (world.ckpt / "logs" / "metrics.jsonl").read_text().splitlines()]
    by_step: dict[int, float] = {}
    for r in records:
        if r["kind"] == "step" and r["step"] <= runs.a_bundle:
            by_step.setdefault(r["step"], r["reward_mean"])
    assert sorted(by_step) == list(range(1, runs.a_bundle + 1)), sorted(by_step)
    rewards = [by_step[s] for s in sorted(by_step)]
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.3, rewards


def test_a_killed_vllm_generation_worker_was_replaced_in_job(world: HfWorld, runs: Runs) -> None:
    """A's worker (the vLLM engine inside it) was SIGKILLed by PID after step 3: A went on in the same process, with
    a new engine serving the current weights version, without losing or repeating a prompt (the test below)."""
    assert "fault generation.worker: recovered" in runs.a_log, runs.a_log[-3000:]
    a = trace_runs(world.trace)[0]
    assert sum(e["ev"] == "generation_restart" for e in a) == 1
    assert not generation_restart_problems(a)
    faults = [e.data for e in read_history(world.ckpt / "logs").events_named("fault")]
    assert [(f["fault"], f["outcome"]) for f in faults] == [("generation.worker", "recovered")], faults
    assert faults[0]["prompts_lost"] == faults[0]["prompts_duplicated"] == 0


@pytest.mark.parametrize(("run", "how"), [(1, "sigkill"), (2, "stop")])
def test_a_resume_restores_policy_loader_place_and_served_version(
    world: HfWorld, runs: Runs, run: int, how: str
) -> None:
    step = runs.a_bundle if how == "sigkill" else runs.b_bundle
    bundle = world.ckpt / f"step_{step}"
    events = trace_runs(world.trace)[run]
    start = events[0]
    assert start["step"] == step
    assert start["restored_policy"] == policy_oracle(bundle, world.model, LR)[0], "not the bundle's state, bit for bit"
    # loader place: the prompts handed out first are the bundle's re-issues, then next_index on (skipping restored)
    loader = torch.load(bundle / "train_dataloader.pt", weights_only=True)
    sidecar = torch.load(bundle / "replay_buffer_metadata.pt", weights_only=True)
    restored = {g["prompt_index"] for g in sidecar["groups"].values()}
    issued = [i for e in events if e["ev"] == "issue" for i in e["prompts"]]
    fresh = (i for i in range(loader["next_index"], loader["next_index"] + 10_000) if i not in restored)
    expected = [i for i in loader["reissue"] if i not in restored] + [next(fresh) for _ in range(len(issued))]
    assert issued == expected[: len(issued)]
    # weights version: the engine served the bundle's version from the first generate call on
    # (never the model directory's version 0, never older than the bundle; a train step on restored groups that
    # finished before the first call may legitimately have moved the version on)
    versions = [e["version"] for e in events if e["ev"] == "rollout"]
    first = next(n for n, e in enumerate(events) if e["ev"] == "rollout")
    trained_before = sum(1 for e in events[:first] if e["ev"] == "train")
    assert versions and step <= versions[0] <= step + trained_before and min(versions) >= step, versions
    if trained_before == 0:
        assert versions[0] == step
    assert versions == sorted(versions)


def test_stop_cut_a_bundle_and_the_last_run_finished(world: HfWorld, runs: Runs) -> None:
    assert f"stopped: step {runs.b_bundle} saved on request" in runs.b_log, runs.b_log[-3000:]
    assert f"resuming from {world.ckpt / f'step_{runs.b_bundle}'}" in runs.c.out, runs.c.out[-3000:]
    assert f"done: step {runs.b_bundle + 2}" in runs.c.out


def test_every_run_served_one_version_per_call_in_order_and_bundles_hold_nothing_of_vllm(
    cli: InProcess, world: HfWorld, runs: Runs
) -> None:
    for events in trace_runs(world.trace):
        trained = [e["step"] for e in events if e["ev"] == "train"]
        versions = [e["version"] for e in events if e["ev"] == "rollout"]
        assert versions == sorted(versions) and all(v <= max(trained, default=0) + 1 for v in versions)
    for step in step_bundles(world.ckpt):
        manifest = json.loads((world.ckpt / f"step_{step}" / "manifest.json").read_text())
        for rel in manifest["files"]:
            assert BUNDLE_FILES.fullmatch(rel) and "vllm" not in rel.lower(), (step, rel)
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(world.ckpt))
    assert verify.rc == 0, verify.out


def test_no_prompt_is_trained_twice_across_resumes(world: HfWorld, runs: Runs) -> None:
    trained = trained_prompts(world.trace, 0, runs.a_bundle)  # run A was SIGKILLed
    assert trained and len(trained) == len(set(trained)), "a prompt index was trained twice"
