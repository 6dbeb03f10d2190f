"""Helpers for the hf-backend tests: a tiny random HF model built inside the test, JSONL files, and running a
function on N gloo ranks in fresh processes (``torch.multiprocessing.spawn``). Nothing is downloaded."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: tuple[Any, ...]) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
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
    mp.spawn(_entry, args=(fn, world, free_port(), str(out), args), nprocs=world, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
