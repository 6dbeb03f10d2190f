"""Section 7: training time lost to checkpointing at a realistic step — the hf backend (a random Llama of ~20 M
parameters built locally, nothing downloaded) on CPU, the real controller driven like ``sc-app run``, a bundle
every 10 steps, the run's own accounting (``end_to_end.save_cost``: training paused per save + the excess of every
step a save touched over the run's untouched steps) over the measured span. Target (issue 21): <= 1%.

Full runs only: at ~1-3 s per step it takes minutes; ``--quick`` records why it was left out.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.scbench.common import Harness, check
from bench.scbench.end_to_end import _cfg, run_controller, save_cost

SPEC = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 64,
}
STEPS, WARM, SAVE_PERIOD = 22, 2, 10
PROMPTS = [{"prompt": f"what is {a} + {b} ?", "answer": str(a + b)} for a in range(10) for b in range(10)]


def _dataset(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    return path


def run(h: Harness) -> dict[str, Any]:
    if h.quick:
        return {"skipped": "--quick: a run of 22 hf steps takes minutes"}
    from sc_app.progress import SaveRecord, StepRecord
    from sc_app.rl.hf.random_model import RandomModelSpec, write_random_model

    print("[hf run] ~20M-parameter Llama, a bundle every 10 steps ...", flush=True)
    h.use_units(1)
    model_dir = write_random_model(h.work / "hf-model", RandomModelSpec(**SPEC))
    data = _dataset(h.work / "hf-data.jsonl")
    extra = {
        "model": {"backend": "hf", "path": str(model_dir)},
        "task": {"name": "jsonl", "path": str(data), "prompt_len": 16, "response_len": 8},
        "grpo": {"prompts_per_step": 4, "group_size": 4},
        "checkpoint": {"save_period": SAVE_PERIOD},
    }
    res = run_controller(h, _cfg(h, "hf_run", steps=STEPS, enabled=True, extra=extra))
    trains = [e for e in res["trace"] if e.get("ev") == "train"]
    check(len(trains) == STEPS, f"hf run trained {len(trains)} of {STEPS} steps")
    saves = [r for r in res["records"] if isinstance(r, SaveRecord)]
    want = STEPS // SAVE_PERIOD + (STEPS % SAVE_PERIOD != 0)  # and one at the last step
    check(len(saves) == want, f"hf run cut {len(saves)} bundles, expected {want}")
    steps = [r.step_seconds for r in res["records"] if isinstance(r, StepRecord) and r.step > WARM]
    span = trains[-1]["t"] - trains[WARM - 1]["t"]
    lost = save_cost(res["records"], res["trace"], WARM)
    bundle = max((h.work / "hf_run").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    policy_bytes = sum(p.stat().st_size for p in (bundle / "policy").rglob("*") if p.is_file())
    return {
        "spec": SPEC,
        "steps": STEPS,
        "save_period": SAVE_PERIOD,
        "step_s": statistics.median(steps),
        "span_s": span,
        "saves": len(saves),
        "save_s": [s.seconds for s in saves],
        "blocked_s": [s.paused_seconds for s in saves],
        "lost_s": lost,
        "lost_share": lost / span,
        "policy_bytes": policy_bytes,
        "load_avg": res["load_avg"],
    }
