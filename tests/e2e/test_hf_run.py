"""End to end on the hf backend: ``sc-app run`` in subprocesses (real Ray, real TransferQueue) on a tiny random
Hugging Face model and tokenizer built inside the test, a JSONL dataset and a user reward function.

One checkpoint directory, three training runs:
  A. 1 trainer (ddp), fresh, to step 4: bundles verify, record the dataset, the user's reward is called;
  B. 2 trainers (fsdp), resumes step_4 (1 -> 2): the restored state is bit-identical to the bundle's; its generation
     worker (the hf engine) is SIGKILLed by PID once B trains and is replaced in-job; B is SIGKILLed once a newer
     bundle exists and training went past it;
  C. 1 trainer, resumes the newest bundle after the kill (2 -> 1): again bit-identical; it finishes.
Then, without Ray: export + from_pretrained gives the bundle's logits; a changed dataset is refused (and accepted
with task.allow_changed_dataset); bad model / reward / tiny export are one-line refusals. Those commands, and
``ckpt verify``, run in the test's process (the ``cli`` fixture): no interpreter start each.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from sc_app.io import hashing
from sc_app.observe.reader import read_history
from tests.support.cli import InProcess
from tests.support.hf import ARITHMETIC, HfWorld, hf_world, make_model_dir, policy_oracle, sets
from tests.support.proc import (
    Finished,
    actor_pids,
    kill_session,
    kill_when,
    past_a_new_bundle,
    start_logged,
    step_bundles,
    trace_runs,
    trained_prompts,
    wait_for,
)
from tests.support.restart import generation_restart_problems, restarted_and_trained, trained_steps

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 420
LR = 1e-2
INPUT = torch.tensor([[1, 20, 15, 8, 9, 10, 11, 12]])
REWARD = (  # the user's reward: numeric_match, logging every call to SC_APP_TEST_REWARD_LOG
    "import json, os\n"
    "from sc_app.rl.hf.rewards import numeric_match\n"
    "def score(*, prompt, completion, answer):\n"
    "    with open(os.environ['SC_APP_TEST_REWARD_LOG'], 'a') as f:\n"
    "        f.write(json.dumps([prompt, completion, answer]) + '\\n')\n"
    "    return numeric_match(prompt=prompt, completion=completion, answer=answer)\n"
)


def oracle(bundle: Path, model_dir: Path) -> tuple[dict[str, str], Any]:
    return policy_oracle(bundle, model_dir, LR)


def reward_log(world: HfWorld) -> Path:
    return world.base / "reward_calls.jsonl"


@pytest.fixture
def user_cli(cli: InProcess, world: HfWorld, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    """The ``cli`` fixture with the user's reward module importable, as the world's PYTHONPATH makes it for a run:
    for the commands that stop before Ray (a refusal, a plan, nothing to train)."""
    monkeypatch.syspath_prepend(str(world.base / "user_code"))
    return cli


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> HfWorld:
    base = tmp_path_factory.mktemp("hf-e2e")
    return hf_world(
        base,
        model=make_model_dir(base / "model"),
        rows=ARITHMETIC * 4,
        reward=("my_reward", REWARD),
        lr=LR,
        env={"SC_APP_TEST_REWARD_LOG": str(base / "reward_calls.jsonl")},
    )


@dataclass
class Runs:
    a: Finished
    b_log: str
    b_bundle: int  # the newest bundle when B was killed
    c: Finished
    c_max_steps: int
    oracles: dict[int, dict[str, str]]


@pytest.fixture(scope="module")
def runs(world: HfWorld) -> Runs:
    world.clear_runs()  # a rerun (Ray did not start in time) begins again on an empty directory
    a = world.sc_app(*world.run_args(4, "trainer.num_workers=1"), timeout=RUN_TIMEOUT)
    assert a.rc == 0, a.out[-4000:]
    oracles = {4: oracle(step_bundles(world.ckpt)[4], world.model)[0]}
    log = world.base / "run_b.log"
    b_args = world.run_args(10_000, "trainer.num_workers=2", "trainer.strategy=fsdp")
    proc = start_logged(*b_args, log=log, env=world.env)
    try:
        wait_for(lambda: trained_steps(world.trace, 1) >= 1, RUN_TIMEOUT, "run B's first step", proc)
        (victim,) = actor_pids(proc.pid, "GenerationWorker")  # the hf engine's worker dies mid-run: replaced in-job
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: restarted_and_trained(world.trace, 1), RUN_TIMEOUT, "run B's new generation worker", proc)
    except BaseException:
        kill_session(proc.pid)
        raise
    kill_when(lambda: past_a_new_bundle(world.trace, 1, 10), proc, RUN_TIMEOUT, "run B past a new bundle", log=log)
    b_bundle = max(step_bundles(world.ckpt))
    oracles[b_bundle] = oracle(step_bundles(world.ckpt)[b_bundle], world.model)[0]
    c = world.sc_app(*world.run_args(b_bundle + 2, "trainer.num_workers=1"), timeout=RUN_TIMEOUT)
    assert c.rc == 0, c.out[-4000:]
    return Runs(a, log.read_text(), b_bundle, c, b_bundle + 2, oracles)


# ------------------------------------------------------------------------------------------------ runs
def test_bundles_verify_and_hold_sharded_policies_and_the_dataset(cli: InProcess, world: HfWorld, runs: Runs) -> None:
    verify = cli("ckpt", "verify", "--checkpoint-dir", str(world.ckpt))
    assert verify.rc == 0, verify.out
    sha = hashlib.sha256(world.data.read_bytes()).hexdigest()
    assert {2, 4, 6, runs.b_bundle, runs.c_max_steps} <= set(step_bundles(world.ckpt))
    for step, bundle in step_bundles(world.ckpt).items():
        manifest = json.loads((bundle / "manifest.json").read_text())
        assert manifest["dataset"] == {"path": str(world.data), "sha256": sha, "rows": len(ARITHMETIC) * 4}
        assert manifest["compat"]["model.backend"] == "hf"
        policy = {rel.removeprefix("policy/") for rel in manifest["files"] if rel.startswith("policy/")}
        assert {".metadata", "hf/config.json", "hf/tokenizer.json"} <= policy, (step, policy)
        shards = {p for p in policy if p.endswith(".distcp")}
        two_ranks = 4 < step <= runs.b_bundle  # B's bundles: both trainers wrote their shard
        assert shards == ({"__0_0.distcp", "__1_0.distcp"} if two_ranks else {"__0_0.distcp"}), (step, shards)
        for rel, info in manifest["files"].items():
            data = (bundle / rel).read_bytes()
            assert hashing.digest_bytes(data, manifest["hash_alg"]) == info["digest"], (bundle.name, rel)


def test_the_users_reward_function_scored_every_row(world: HfWorld, runs: Runs) -> None:
    calls = [json.loads(line) for line in reward_log(world).read_text().splitlines()]
    assert len(calls) >= 4 * 4 * 4, "A alone trained 4 steps of 4 groups x 4 rows"
    prompts = {row["prompt"]: str(row["answer"]) for row in ARITHMETIC}
    for prompt, completion, answer in calls:
        assert prompts[prompt] == answer and isinstance(completion, str)
    assert re.search(r"^step\s+1/4\s+reward [0-9.]+", runs.a.out, re.M)


@pytest.mark.parametrize("run", [1, 2], ids=["1-to-2-trainers", "2-to-1-trainer"])
def test_resharded_resume_restores_the_bundles_exact_state(world: HfWorld, runs: Runs, run: int) -> None:
    step = {1: 4, 2: runs.b_bundle}[run]
    start = trace_runs(world.trace)[run][0]
    assert start["step"] == step
    assert start["restored_policy"] == runs.oracles[step], "weights and Adam state equal the bundle's, bit for bit"


def test_after_sigkill_the_rerun_resumes_the_newest_bundle_exactly(world: HfWorld, runs: Runs) -> None:
    assert f"resuming from {world.ckpt / f'step_{runs.b_bundle}'}" in runs.c.out, runs.c.out[-3000:]
    start = trace_runs(world.trace)[2][0]
    assert start["step"] == runs.b_bundle
    assert start["restored_policy"] == runs.oracles[runs.b_bundle]
    assert f"done: step {runs.c_max_steps}" in runs.c.out


def test_b_replaced_its_killed_generation_worker_in_job(world: HfWorld, runs: Runs) -> None:
    """The hf engine's worker, SIGKILLed mid-run, came back in the same process with the current weights."""
    assert "fault generation.worker: recovered" in runs.b_log, runs.b_log[-3000:]
    attempts = trace_runs(world.trace)
    assert len(attempts) == 3, "B recovered without a process exit: one start per run"
    b = attempts[1]
    assert sum(e["ev"] == "generation_restart" for e in b) == 1
    assert not generation_restart_problems(b)
    faults = [e.data for e in read_history(world.ckpt / "logs").events_named("fault")]
    assert [(f["fault"], f["outcome"]) for f in faults] == [("generation.worker", "recovered")], faults
    assert faults[0]["prompts_lost"] == faults[0]["prompts_duplicated"] == 0


def test_no_prompt_is_trained_twice_across_resumes(world: HfWorld, runs: Runs) -> None:
    trained = trained_prompts(world.trace, 1, runs.b_bundle)  # run B was SIGKILLed
    assert trained and len(trained) == len(set(trained)), "a prompt index was trained twice"


# ------------------------------------------------------------------------------------------------ export
def test_export_loads_with_from_pretrained_and_gives_the_bundles_logits(
    cli: InProcess, world: HfWorld, runs: Runs
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = world.base / "exported"
    result = cli("export", "--checkpoint-dir", str(world.ckpt), "--out", str(out))
    newest = max(step_bundles(world.ckpt))
    assert result.rc == 0 and f"exported step_{newest}" in result.out, result.out
    _, trained = oracle(step_bundles(world.ckpt)[newest], world.model)
    exported = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        assert torch.equal(exported(INPUT).logits, trained(INPUT).logits)
        original = AutoModelForCausalLM.from_pretrained(world.model)
        assert not torch.equal(original(INPUT).logits, trained(INPUT).logits), "training changed the model"
    assert AutoTokenizer.from_pretrained(out).chat_template == AutoTokenizer.from_pretrained(world.model).chat_template
    again = cli("export", "--checkpoint-dir", str(world.ckpt), "--out", str(out))
    assert again.rc == 2 and "not an empty directory" in again.out


# ------------------------------------------------------------------------------------------------ refusals
def tree(root: Path) -> dict[str, str]:
    """Every bundle-side file with its sha256 (not the lease files, not the run log, which records the attempt)."""
    return {
        rel: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.name.startswith((".lease", "LEASE"))
        and not (rel := p.relative_to(root).as_posix()).startswith("logs/")
    }


def test_a_changed_dataset_is_refused_unless_allowed(user_cli: InProcess, world: HfWorld, runs: Runs) -> None:
    changed = world.base / "data_changed"
    shutil.copytree(world.ckpt, changed)
    data = world.data.read_text()
    world.data.write_text(data + json.dumps({"prompt": "what is 5 + 5 ?", "answer": "10"}) + "\n")
    try:
        before = tree(changed)
        again = world.run_args(runs.c_max_steps + 2)
        refused = user_cli(*again, "--checkpoint-dir", str(changed))
        assert refused.rc == 2, refused.out[-3000:]
        error = [line for line in refused.out.splitlines() if line.startswith("sc-app: error:")]
        assert len(error) == 1 and "task.allow_changed_dataset=true" in error[0] and str(world.data) in error[0]
        assert tree(changed) == before, "a refused run changed the checkpoint directory"
        pre = user_cli("preflight", "--checkpoint-dir", str(changed), *sets(*world.settings))
        assert pre.rc == 2 and "task.allow_changed_dataset" in pre.out
        allowed = user_cli(
            *world.run_args(runs.c_max_steps),
            "--checkpoint-dir",
            str(changed),
            "--set",
            "task.allow_changed_dataset=true",
        )
        assert allowed.rc == 0 and "nothing to train" in allowed.out, allowed.out[-3000:]
    finally:
        world.data.write_text(data)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("model.path={base}/no-such-model", "does not exist"),
        ("task.reward=my_reward:nope", "has no attribute 'nope'"),
        ("task.prompt_len=4", "over task.prompt_len=4"),
    ],
)
def test_bad_inputs_are_one_line_before_ray_starts(
    user_cli: InProcess, world: HfWorld, override: str, named: str
) -> None:
    result = user_cli(*world.run_args(2, override.format(base=world.base)), "--checkpoint-dir", str(world.base / "x"))
    assert result.rc == 2, result.out[-3000:]
    errors = [line for line in result.out.splitlines() if line.startswith("sc-app: error:")]
    assert len(errors) == 1 and named in errors[0], result.out[-3000:]
    assert "Traceback" not in result.out
    assert not (world.base / "x").exists() or not list((world.base / "x").glob("step_*"))


def test_exporting_a_tiny_bundle_says_there_is_nothing_to_export(cli: InProcess, tmp_path: Path) -> None:
    from tests.support.bundles import make_bundle

    make_bundle(tmp_path / "ck", 2)  # --out outside the checkpoint dir (inside it is refused before anything)
    result = cli("export", "--checkpoint-dir", str(tmp_path / "ck"), "--out", str(tmp_path / "out"))
    assert result.rc == 2 and "nothing to export" in result.out and not (tmp_path / "out").exists()
