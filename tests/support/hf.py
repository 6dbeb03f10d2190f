"""Helpers for the hf-backend tests: a tiny random HF model built inside the test, JSONL files, the setup of an
end-to-end ``sc-app run`` on them (``HfWorld``), and running a function on N gloo ranks in fresh processes
(``torch.multiprocessing.spawn``). Nothing is downloaded."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.proc import Finished, sc_app

ARITHMETIC = [
    {"prompt": "what is 3 + 4 ?", "answer": "7"},
    {"prompt": "what is 2 + 2 ?", "answer": "4"},
    {"prompt": "what is 9 - 5 ?", "answer": "4"},
    {"prompt": "what is 6 * 1 ?", "answer": "6"},
    {"prompt": "what is 1 + 0 ?", "answer": "1"},
    {"prompt": "what is 8 - 8 ?", "answer": 0},
]


def make_model_dir(root: Path, **spec: Any) -> Path:
    from sc_app.rl.hf.random_model import RandomModelSpec, write_random_model

    return write_random_model(root, RandomModelSpec(**spec))


def policy_oracle(bundle: Path, model_dir: Path, lr: float) -> tuple[dict[str, str], Any]:
    """A bundle's policy read with DCP's own reader into a plain model + Adam (not sc-app's loader): its
    fingerprint and the model."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from transformers import AutoModelForCausalLM

    from sc_app.rl.fingerprint import full_fingerprint

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optimizer": osd}
    dcp.load(state, checkpoint_id=bundle / "policy", no_dist=True)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    fp = full_fingerprint(model, opt)
    assert fp is not None
    return {"weights": fp.weights, "optimizer": fp.optimizer}, model


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sets(*overrides: str) -> list[str]:
    """``--set`` arguments, one per ``key=value``."""
    return [arg for kv in overrides for arg in ("--set", kv)]


@dataclass
class HfWorld:
    """One checkpoint directory that end-to-end tests run ``sc-app run`` on, model.backend=hf: a tiny model built
    in the test, a JSONL task, a user reward module on PYTHONPATH, a bundle every 2 steps (all kept) and a trace."""

    base: Path
    model: Path
    data: Path
    ckpt: Path
    trace: Path
    env: dict[str, str]
    settings: list[str]

    def run_args(self, max_steps: int, *extra: str) -> list[str]:
        """``sc-app run`` on the world's directory with its settings, then ``extra`` (``key=value``) overrides."""
        return ["run", "--checkpoint-dir", str(self.ckpt), "--max-steps", str(max_steps), *sets(*self.settings, *extra)]

    def sc_app(self, *args: str, timeout: float) -> Finished:
        return sc_app(*args, timeout=timeout, env=self.env)

    def clear_runs(self) -> None:
        """No bundle and no trace: what a module's runs start from (again, when a rerun rebuilds them)."""
        shutil.rmtree(self.ckpt, ignore_errors=True)
        self.trace.unlink(missing_ok=True)


def hf_world(
    base: Path,
    *,
    model: Path,
    rows: list[dict[str, Any]],
    reward: tuple[str, str],
    lr: float,
    settings: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> HfWorld:
    """An ``HfWorld`` under ``base``: ``rows`` as the task, ``reward`` = (module name, its source, which defines
    ``score``) as the user's reward, GRPO 4 prompts x 4 rows at ``lr``; ``settings`` and ``env`` added."""
    module, source = reward
    user = base / "user_code"
    user.mkdir()
    (user / f"{module}.py").write_text(source)
    data = write_jsonl(base / "data.jsonl", rows)
    trace = base / "trace.jsonl"
    common = [
        "model.backend=hf",
        f"model.path={model}",
        "task.name=jsonl",
        f"task.path={data}",
        f"task.reward={module}:score",
        "task.prompt_len=12",
        "task.response_len=4",
        "grpo.prompts_per_step=4",
        "grpo.group_size=4",
        f"grpo.learning_rate={lr}",
        "checkpoint.save_period=2",
        "checkpoint.keep=50",  # every bundle stays for the tests' checks
        f"run.trace_file={trace}",
    ]
    path = os.pathsep.join(filter(None, [str(user), os.environ.get("PYTHONPATH", "")]))
    return HfWorld(base, model, data, base / "ckpt", trace, {"PYTHONPATH": path, **(env or {})}, [*common, *settings])


def _entry(rank: int, fn: Callable[..., Any], world: int, store: str, out: str, args: tuple[Any, ...]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # a file rendezvous: a port picked here and bound later could be taken in between on a busy machine
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, tmp: Path) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` gloo ranks in fresh processes; returns each rank's JSON result."""
    import torch.multiprocessing as mp

    out = tmp / f"ranks-{fn.__name__}-{world}"
    out.mkdir(parents=True, exist_ok=True)
    store = out / f"store-{uuid.uuid4().hex}"
    mp.spawn(_entry, args=(fn, world, str(store), str(out), args), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
