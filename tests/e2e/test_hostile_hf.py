"""Issue 22 on the hf backend through ``sc-app run``: bad weights, index paths and reward modules are refused in one
line before Ray starts and before the lease is taken (``main`` in this process, the ``cli`` fixture); a reward
function that fails while the job runs (a subprocess: it starts Ray) ends it with exit 1 and one line naming the
function — through the generation worker, the controller and the job's error mapping — with no traceback, and every
bundle published before still verifies.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from sc_app.checkpoint import verify_bundle
from sc_app.checkpoint.lease import LEASE_FILE
from tests.support.cli import InProcess, Ran
from tests.support.hf import ARITHMETIC, make_model_dir, write_jsonl
from tests.support.proc import Finished, sc_app

REWARDS = """
import os, pathlib

def _calls():
    counter = pathlib.Path(os.environ["HOSTILE_COUNTER"])
    with open(counter, "a") as f:
        f.write("x")
    return counter.stat().st_size

def ok(*, prompt, completion, answer):
    return 0.5

def raises(*, prompt, completion, answer):
    if _calls() > int(os.environ["HOSTILE_AFTER"]):
        raise ValueError("boom after the first bundles")
    return 0.5

def exits(*, prompt, completion, answer):
    if _calls() > int(os.environ["HOSTILE_AFTER"]):
        raise SystemExit(7)
    return 0.5
"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-hf")
    (root / "user").mkdir()
    (root / "user" / "hostile_rewards.py").write_text(REWARDS)
    (root / "user" / "exits_on_import.py").write_text("import os\nos._exit(0)\ndef score(**kw):\n    return 1.0\n")
    (root / "user" / "bad_syntax.py").write_text("def score(*, prompt, completion, answer)\n    return 1.0\n")
    make_model_dir(root / "model")
    write_jsonl(root / "data.jsonl", ARITHMETIC * 4)
    return root


def run_argv(base: Path, ckpt: Path, *sets: str, model: Path | None = None, max_steps: int = 4) -> list[str]:
    settings = [
        "model.backend=hf",
        f"model.path={model or base / 'model'}",
        "task.name=jsonl",
        f"task.path={base / 'data.jsonl'}",
        "task.reward=hostile_rewards:ok",
        "task.prompt_len=12",
        "task.response_len=4",
        "grpo.prompts_per_step=4",
        "grpo.group_size=4",
        "checkpoint.save_period=2",
        *sets,
    ]
    args = ["run", "--checkpoint-dir", str(ckpt), "--max-steps", str(max_steps)]
    for s in settings:
        args += ["--set", s]
    return args


def run(base: Path, ckpt: Path, *sets: str, max_steps: int = 4, env: dict[str, str] | None = None) -> Finished:
    """``sc-app run`` in a process of its own (it starts Ray), the user's modules on its PYTHONPATH."""
    pythonpath = os.pathsep.join(filter(None, [str(base / "user"), os.environ.get("PYTHONPATH", "")]))
    argv = run_argv(base, ckpt, *sets, max_steps=max_steps)
    # a hang guard, not a speed check: ~20 s alone, 112 s in a quiet suite, over 420 s with two suites on the 2 cores
    # (load 50: Ray's start timed out once, then the set-up); pytest's own limit is 900 s a test
    return sc_app(*argv, timeout=840, env={"PYTHONPATH": pythonpath, **(env or {})})


def one_error(result: Finished | Ran, code: int, *named: str) -> str:
    errors = [line for line in result.out.splitlines() if line.startswith("sc-app: error:")]
    assert result.rc == code, result.out[-4000:]
    assert len(errors) == 1 and all(n in errors[0] for n in named), result.out[-4000:]
    assert "Traceback" not in result.out, result.out[-4000:]
    return errors[0]


def broken_model(base: Path, tmp: Path, case: str) -> Path:
    import shutil

    model = Path(shutil.copytree(base / "model", tmp / "model"))
    st = model / "model.safetensors"
    raw = st.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    if case == "no tensors":
        body = json.dumps({"__metadata__": {"format": "pt"}}).encode()
        st.write_bytes(struct.pack("<Q", len(body)) + body)
    elif case == "corrupt header":
        st.write_bytes(raw[:8] + b"{" * n + raw[8 + n :])
    elif case == "index outside":
        st.rename(model / "model-00001-of-00001.safetensors")
        header = json.loads(raw[8 : 8 + n])
        weight_map = {k: "model-00001-of-00001.safetensors" for k in header if k != "__metadata__"}
        weight_map["model.norm.weight"] = "../outside.safetensors"
        (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return model


BEFORE_RAY = {
    "no tensors": ([], "missing lm_head.weight"),
    "corrupt header": ([], "not a usable safetensors file"),
    "index outside": ([], "climbs with '..'"),
    "reward exits on import": (["task.reward=exits_on_import:score"], "ended the process (exit code 0)"),
    "reward syntax error": (["task.reward=bad_syntax:score"], "SyntaxError"),
}


@pytest.mark.parametrize("case", sorted(BEFORE_RAY))
def test_bad_weights_and_reward_modules_are_refused_before_ray_and_the_lease(
    cli: InProcess, monkeypatch: pytest.MonkeyPatch, base: Path, tmp_path: Path, case: str
) -> None:
    """In this process: the user's module is imported by a probe child first (``sc_app.rl.hf.reward_probe``), so an
    ``os._exit`` at import ends that child, never the test; ``sys.path`` is what the probe hands it."""
    sets, named = BEFORE_RAY[case]
    model = broken_model(base, tmp_path, case) if not sets else None
    ckpt = tmp_path / "ck"
    monkeypatch.syspath_prepend(str(base / "user"))
    result = cli(*run_argv(base, ckpt, *sets, model=model))
    one_error(result, 2, named)
    assert not (ckpt / LEASE_FILE).exists(), "refused before the lease is taken"
    assert "Started a local Ray instance" not in result.out


# One Ray run: the other failures (exit, NaN, a string, None) take the same path from ``score`` on
# (tests/unit/rl/hf/test_hostile_inputs.py checks each becomes a RewardFailed naming the function).
@pytest.mark.slow  # the only one here that starts Ray; the refusals above take seconds in-process
@pytest.mark.parametrize(("fn", "named"), [("raises", "ValueError: boom")])
def test_a_reward_failing_at_run_time_is_one_line_naming_it_and_loses_nothing(
    base: Path, tmp_path: Path, fn: str, named: str
) -> None:
    ckpt = tmp_path / "ck"
    env = {"HOSTILE_COUNTER": str(tmp_path / "calls"), "HOSTILE_AFTER": "48"}  # 16 rows a step: fails in step 3-4
    result = run(base, ckpt, f"task.reward=hostile_rewards:{fn}", max_steps=8, env=env)
    one_error(result, 1, f"hostile_rewards:{fn}", named)
    bundles = sorted(ckpt.glob("step_*"))
    assert bundles, result.out[-4000:]
    assert all(verify_bundle(b).ok for b in bundles)
