"""Sections 4-5: the real controller (``setup_single_controller`` + ``SingleControllerActor``), driven by
``sc_app.attempt.poll.drive`` like ``sc-app run`` drives it, in the harness's Ray.

* default config: checkpointing off vs on, interleaved (off, on, off, on): steps/s, the in-run cost of saving, and
  where a step's time goes (``StepRecord.phase_seconds``);
* the realistic shape — 64 prompts x 16 generations per step, rows of ~2 KiB (224 prompt + 16 response tokens as
  int64, 16 logprobs), 2 storage units — with the rollout pump's groups committed in one put per generate call
  (now) and one put per group (before: ``data_plane.groups_per_put=1``), interleaved: the data-plane share of the
  step;
* resume vs cold start, and a resume from the newest bundle padded to the largest data-plane size, repeated
  against a cold start each time (the resume target must hold in at least 7 of 8 rounds).
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from bench.scbench.common import DEFAULT_SAVE_PERIOD, Harness, MiB, check, drop_cache, files_under, load_avg, summary
from bench.scbench.common import raw_read as raw_read_file
from bench.scbench.common import raw_write as raw_write_file
from bench.scbench.padded_bundle import pad_bundle

REALISTIC = {
    "grpo": {"prompts_per_step": 64, "group_size": 16, "max_groups_buffered": 160},
    "task": {"prompt_len": 224, "response_len": 16},
    # the toy generator recomputes the whole sequence for every token: the smallest model keeps a step to seconds
    "model": {"max_seq_len": 256, "d_model": 16, "n_layers": 1, "n_heads": 1},
    "data_plane": {"storage_units": 2},
}
REALISTIC_ROW_BYTES = (224 + 16) * 8 + 16 * 4 + 4 + 4  # tokens, logprobs, reward, advantage
STEPS = (120, 6)  # default-config runs: steps (full, quick)
REALISTIC_STEPS = ((10, 2), (2, 1))  # realistic-shape runs: (steps, warm-up steps not counted), (full, quick)
RESUME_ROUNDS = 8  # padded resume vs cold start, full run
RESUME_TARGET_ROUNDS = 7  # ... of which the target must hold in this many


def _cfg(h: Harness, name: str, *, steps: int, enabled: bool, extra: dict[str, Any] | None = None) -> Any:
    from sc_app.config.app import AppConfig

    ckpt_dir = h.work / name
    tree: dict[str, Any] = {
        "run": {"max_steps": steps, "trace_file": str(h.work / f"{name}.trace")},
        "ray": {"namespace": f"bench-{uuid.uuid4().hex[:8]}"},
        "data_plane": {"partition": "e2e"},
        "checkpoint": {"dir": str(ckpt_dir), "enabled": enabled, "keep": 2},
    }
    for section, values in (extra or {}).items():
        tree.setdefault(section, {}).update(values)
    return AppConfig.model_validate(tree)


def run_controller(h: Harness, cfg: Any) -> dict[str, Any]:
    """Plan, set up (restore if there is a bundle), drive to max_steps; times from the plan to each step."""
    import ray

    from sc_app.attempt.poll import drive
    from sc_app.attempt.setup import setup_single_controller
    from sc_app.checkpoint import hmac_key_from_env, plan_resume
    from sc_app.checkpoint.compat import compat_of

    h.clear_all()
    t0 = time.perf_counter()
    plan = plan_resume(
        cfg.checkpoint.dir, on_corrupt="strict", hmac_key=hmac_key_from_env(), expected_compat=compat_of(cfg)
    )
    check(plan.decision in ("fresh", "resume"), f"plan refused: {plan.reason}")
    t_plan = time.perf_counter()
    setup = setup_single_controller(cfg, plan, run_id=uuid.uuid4().hex[:12])
    t_setup = time.perf_counter()
    records: list[Any] = []
    first_at: list[float] = []

    def on_progress(record: Any) -> None:
        if not first_at:
            first_at.append(time.perf_counter())
        records.append(record)

    load = load_avg()
    summary_ = drive(
        setup.actor,
        emergency_budget_s=cfg.checkpoint.emergency_budget_s,
        on_progress=on_progress,
        stop_requested=lambda: False,
        poll_seconds=0.02,
    )
    end = time.perf_counter()
    for actor in [setup.actor, *setup.policy.trainers, *setup.policy.generators]:
        ray.kill(actor)
    trace = [json.loads(line) for line in Path(cfg.run.trace_file).read_text().splitlines()]
    Path(cfg.run.trace_file).unlink()
    started = next(e["t"] for e in trace if e.get("ev") == "start")
    first_train = next(e["t"] for e in trace if e.get("ev") == "train")
    return {
        "actor_to_first_step_s": first_train - started,
        "trainer_load_s": setup.seconds.get("trainer_load_wait", 0.0),
        "data_plane_restore_s": setup.seconds.get("data_plane_restore", 0.0),
        "decision": plan.decision,
        "plan_s": t_plan - t0,
        "setup_s": t_setup - t_plan,
        "first_step_s": (first_at[0] if first_at else end) - t0,
        "total_s": end - t0,
        "records": records,
        "trace": trace,
        "summary": summary_,
        "load_avg": load,
    }


def phase_means(records: list[Any], warm: int) -> dict[str, Any]:
    """Mean seconds per step of every phase (steps after ``warm``), and the data-plane share of the step."""
    from sc_app.phases import ALL, data_plane_seconds
    from sc_app.progress import StepRecord

    steps = [r for r in records if isinstance(r, StepRecord) and r.step > warm and r.phase_seconds]
    n = max(1, len(steps))
    means = {key: sum(r.phase_seconds.get(key, 0.0) for r in steps) / n for key in ALL}
    step_s = sum(r.step_seconds for r in steps) / n
    dp = sum(data_plane_seconds(r.phase_seconds) for r in steps) / n
    return {"steps": len(steps), "step_s": step_s, "phases": means, "data_plane_s": dp, "data_plane_share": dp / step_s}


def save_cost(records: list[Any], trace: list[dict[str, Any]], warm: int) -> float:
    """Seconds a run lost to saving: the time training was paused for each save (``paused_seconds``) plus,
    for the steps a save touched — the step it was cut at (the trainer copies its state inside it) and those
    that ran while its background write was in flight — their excess over the *mean* of the steps no save
    touched (signed, so noise cancels; not the median: step times are right-skewed, and against the median
    an ordinary step counts as slowed down)."""
    from sc_app.progress import SaveRecord, StepRecord

    step_s = {r.step: r.step_seconds for r in records if isinstance(r, StepRecord) and r.step > warm}
    trained_at = {e["step"]: e["t"] for e in trace if e.get("ev") == "train"}
    saved_at = {e["step"]: e["t"] for e in trace if e.get("ev") == "save"}
    overlapped: set[int] = set()
    paused = 0.0
    for r in records:
        if not isinstance(r, SaveRecord):
            continue
        step = r.step
        paused += r.paused_seconds
        begin = trained_at.get(step, 0.0) + r.paused_seconds
        end = saved_at.get(step, begin)
        overlapped |= {n for n, t in trained_at.items() if n in step_s and t > begin and t - step_s[n] < end}
        overlapped |= {step} & set(step_s)
    clean = [v for n, v in step_s.items() if n not in overlapped]
    if not clean:
        return paused
    base = statistics.fmean(clean)
    return paused + sum(step_s[n] - base for n in overlapped)


# ------------------------------------------------------------------------------------------------ the section
def run(h: Harness) -> dict[str, Any]:
    print("[end to end] default config: checkpointing on vs off ...", flush=True)
    h.use_units(1)
    steps = STEPS[1] if h.quick else STEPS[0]
    order = ["on"] if h.quick else ["off", "on", "off", "on"]
    runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for i, mode in enumerate(order):
        runs[mode].append(_one_run(h, f"e2e_{mode}{i}", mode, steps, warm=2))
    e2e = _on_vs_off(runs, steps)
    e2e["realistic"] = realistic(h)
    h.use_units(1)
    e2e.update(resume(h, h.work / f"e2e_on{len(order) - 1}", steps))
    for i, mode in enumerate(order):
        shutil.rmtree(h.work / f"e2e_{mode}{i}", ignore_errors=True)
    return e2e


def _one_run(h: Harness, name: str, mode: str, steps: int, warm: int) -> dict[str, Any]:
    """One run of the default config with checkpointing ``mode`` ("on" | "off"), checked and measured."""
    from sc_app.progress import SaveRecord, StepRecord

    res = run_controller(h, _cfg(h, name, steps=steps, enabled=mode == "on"))
    trains = [e for e in res["trace"] if e.get("ev") == "train"]
    check(len(trains) == steps, f"{mode} run trained {len(trains)} of {steps} steps")
    span = trains[-1]["t"] - trains[warm - 1]["t"]
    saves = [r for r in res["records"] if isinstance(r, SaveRecord)]
    if mode == "on":
        want = steps // DEFAULT_SAVE_PERIOD + (steps % DEFAULT_SAVE_PERIOD != 0)
        check(len(saves) == want, f"on run cut {len(saves)} bundles, expected {want}")
    return {
        "steps_s": (steps - warm) / span,
        "step_s": statistics.median(
            r.step_seconds for r in res["records"] if isinstance(r, StepRecord) and r.step > warm
        ),
        "save_s": [s.seconds for s in saves],
        "blocked_s": [s.paused_seconds for s in saves],
        "window_ms": [s.window_seconds * 1e3 for s in saves],
        "save_cost_s": save_cost(res["records"], res["trace"], warm),
        "span_s": span,
        "phases": phase_means(res["records"], warm),
        "load_avg": res["load_avg"],
    }


def _on_vs_off(runs: dict[str, list[dict[str, Any]]], steps: int) -> dict[str, Any]:
    """The section's numbers from the runs with checkpointing on and off."""
    rows_per_step = 8 * 8  # grpo defaults: prompts_per_step x group_size
    step_s = statistics.median(r["step_s"] for r in runs["off"] + runs["on"])
    windows = [w for r in runs["on"] for w in r["window_ms"]]
    e2e: dict[str, Any] = {
        "steps": steps,
        "save_period": DEFAULT_SAVE_PERIOD,
        "step_s": step_s,
        "steps_s_on": summary([r["steps_s"] for r in runs["on"]]),
        "rows_s_on": summary([r["steps_s"] * rows_per_step for r in runs["on"]]),
        "save_s": summary([s for r in runs["on"] for s in r["save_s"]]),
        "blocked_s": summary([s for r in runs["on"] for s in r["blocked_s"]]),
        "window_ms": summary(windows),
        "window_over_step": statistics.median(windows) / 1e3 / step_s,
        "window_over_period": statistics.median(windows) / 1e3 / (step_s * DEFAULT_SAVE_PERIOD),
        # in-run accounting, immune to drift between runs: training paused for the save + how much slower
        # the steps that overlapped its background write were than the run's other steps, over the span
        "overhead_accounted": statistics.median([r["save_cost_s"] / r["span_s"] for r in runs["on"]]),
        "overhead_accounted_runs": [r["save_cost_s"] / r["span_s"] for r in runs["on"]],
        "phases_default": _merge_phases([r["phases"] for r in runs["on"] + runs["off"]]),
        "load_avg": [r["load_avg"] for r in runs["on"] + runs["off"]],
    }
    if runs["off"]:
        e2e["steps_s_off"] = summary([r["steps_s"] for r in runs["off"]])
        e2e["rows_s_off"] = summary([r["steps_s"] * rows_per_step for r in runs["off"]])
        e2e["overhead_measured"] = 1 - e2e["steps_s_on"]["median"] / e2e["steps_s_off"]["median"]
    return e2e


def _merge_phases(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over runs of each run's per-step means."""
    keys = items[0]["phases"].keys()
    return {
        "runs": len(items),
        "step_s": statistics.median(i["step_s"] for i in items),
        "phases": {k: statistics.median(i["phases"][k] for i in items) for k in keys},
        "data_plane_s": statistics.median(i["data_plane_s"] for i in items),
        "data_plane_share": statistics.median(i["data_plane_share"] for i in items),
        "data_plane_share_runs": [i["data_plane_share"] for i in items],
    }


def realistic(h: Harness) -> dict[str, Any]:
    """The realistic shape, batched commits (now) vs one put per group (before), interleaved."""
    print("[end to end] realistic shape: 64 prompts x 16 generations, ~2 KiB rows, 2 units ...", flush=True)
    h.use_units(2)
    steps, warm = REALISTIC_STEPS[1] if h.quick else REALISTIC_STEPS[0]
    order = ["now"] if h.quick else ["now", "before", "now", "before"]
    out: dict[str, list[dict[str, Any]]] = {"now": [], "before": []}
    for i, variant in enumerate(order):
        extra = json.loads(json.dumps(REALISTIC))
        extra["data_plane"]["groups_per_put"] = 0 if variant == "now" else 1
        res = run_controller(h, _cfg(h, f"real_{variant}{i}", steps=steps, enabled=True, extra=extra))
        trains = [e for e in res["trace"] if e.get("ev") == "train"]
        check(len(trains) == steps, f"realistic {variant} run trained {len(trains)} of {steps} steps")
        item = phase_means(res["records"], warm)
        item["load_avg"] = res["load_avg"]
        out[variant].append(item)
        shutil.rmtree(h.work / f"real_{variant}{i}", ignore_errors=True)
    result: dict[str, Any] = {
        "steps": steps,
        "warm": warm,
        "rows_per_step": 64 * 16,
        "row_bytes": REALISTIC_ROW_BYTES,
        "config": REALISTIC,
    }
    for variant, items in out.items():
        if items:
            result[variant] = _merge_phases(items)
    return result


def resume(h: Harness, on_dir: Path, steps: int) -> dict[str, Any]:
    """Cold vs resume (real bundle), then rounds of (cold start, resume of the bundle padded to the largest
    data-plane size); the target for a round: padded first step (verify not counted) <= (that round's cold + bytes /
    raw read) x 1.1."""
    print("[end to end] resume vs cold start ...", flush=True)
    out: dict[str, Any] = {}
    if not h.quick:
        cold, resume_s = [], []
        for rep in range(2):
            cres = run_controller(h, _cfg(h, f"cold{rep}", steps=1, enabled=False))
            cold.append(cres["first_step_s"])
            shutil.rmtree(h.work / f"cold{rep}", ignore_errors=True)
            rd = h.work / f"resume{rep}"
            shutil.copytree(on_dir, rd)
            res = run_controller(h, _cfg(h, f"resume{rep}", steps=steps + 1, enabled=False))
            check(res["decision"] == "resume", "resume run did not resume")
            check(res["records"][0].step == steps + 1, "resume did not continue from the bundle's step")
            resume_s.append(res["first_step_s"])
            shutil.rmtree(rd, ignore_errors=True)
        out["cold_first_step_s"] = summary(cold)
        out["resume_first_step_s"] = summary(resume_s)
        out["resume_over_cold"] = out["resume_first_step_s"]["median"] / out["cold_first_step_s"]["median"]

    big = h.sizes[-1]
    padded = h.work / "resume_big"
    bundle_bytes = pad_bundle(on_dir, padded, big * MiB)
    raw_path = h.work / "raw_big.bin"
    raw_write_file(raw_path, bundle_bytes)
    rounds = []
    for r in range(1 if h.quick else RESUME_ROUNDS):
        rounds.append(_resume_round(h, r, padded, raw_path, steps))
    raw_path.unlink()
    shutil.rmtree(padded, ignore_errors=True)
    out["resume_big"] = _resume_summary(rounds, bundle_bytes)
    return out


def _resume_round(h: Harness, r: int, padded: Path, raw_path: Path, steps: int) -> dict[str, Any]:
    """One round: a cold start (full runs only), a raw read of the padded bundle's bytes, the padded resume."""
    rnd: dict[str, Any] = {}
    if not h.quick:
        cres = run_controller(h, _cfg(h, f"cold_r{r}", steps=1, enabled=False))
        shutil.rmtree(h.work / f"cold_r{r}", ignore_errors=True)
        rnd["cold_first_step_s"] = cres["first_step_s"]
    rnd["raw_read_s"] = raw_read_file(raw_path)
    drop_cache(files_under(padded))
    res = run_controller(h, _cfg(h, "resume_big", steps=steps + 1, enabled=False))
    check(res["decision"] == "resume" and res["records"][0].step == steps + 1, "padded resume")
    rnd.update(
        first_step_s=res["first_step_s"],
        verify_s=res["plan_s"],
        first_step_after_verify_s=res["first_step_s"] - res["plan_s"],
        trainer_load_s=res["trainer_load_s"],
        data_plane_restore_s=res["data_plane_restore_s"],
        actor_to_first_step_s=res["actor_to_first_step_s"],
        startup_s=res["first_step_s"]
        - res["plan_s"]
        - res["trainer_load_s"]
        - res["data_plane_restore_s"]
        - res["actor_to_first_step_s"],
        load_avg=res["load_avg"],
    )
    if "cold_first_step_s" in rnd:
        rnd["budget_s"] = (rnd["cold_first_step_s"] + rnd["raw_read_s"]) * 1.1
        rnd["met"] = rnd["first_step_after_verify_s"] <= rnd["budget_s"]
    return rnd


def _resume_summary(rounds: list[dict[str, Any]], bundle_bytes: int) -> dict[str, Any]:
    judged = [r for r in rounds if "met" in r]
    big: dict[str, Any] = {
        "data_plane_mib": bundle_bytes / MiB,
        "rounds": rounds,
        "met_rounds": sum(1 for r in judged if r["met"]),
        "judged_rounds": len(judged),
        **{
            key: statistics.median(r[key] for r in rounds)
            for key in (
                "first_step_after_verify_s",
                "verify_s",
                "raw_read_s",
                "trainer_load_s",
                "data_plane_restore_s",
                "actor_to_first_step_s",
                "startup_s",
            )
        },
    }
    if judged:
        big["budget_s"] = statistics.median(r["budget_s"] for r in judged)
    return big
