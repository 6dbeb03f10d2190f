"""The CPU-cost tables and the four CPU targets of issue 21 (``bench/README.md``, "CPU cost"): save and restore
CPU-seconds per GiB against TransferQueue's own get/put plus a raw write/read, the stage costs, the hf policy save
(DCP) against a raw write with the pause per 100 MiB, and the training time an hf run lost to checkpointing."""

from __future__ import annotations

from typing import Any

SAVE_TARGET, RESTORE_TARGET, POLICY_TARGET, PAUSE_MS_PER_100MIB, LOST_TARGET = 1.25, 1.25, 1.5, 10.0, 0.01
ROLE_ORDER = ("driver", "storage units", "TQ controller", "ray system", "other ray workers", "other")


def _f(x: float | None, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def _roles(c: dict[str, Any]) -> str:
    roles = c.get("by_role", {})
    return ", ".join(f"{r} {roles[r]:.2f}" for r in ROLE_ORDER if roles.get(r, 0) >= 0.005)


def render(res: dict[str, Any], add: Any) -> None:
    """Append the CPU-cost sections to the markdown being built (``add(line)``)."""
    rows = [r for r in res.get("data_plane") or [] if "cpu" in r]
    if rows:
        add("### CPU cost of a save and a restore (CPU-seconds per GiB; every process of the run)")
        add("")
        add("Driver (with the stream writer threads), TransferQueue's controller and storage units, Ray's own")
        add("processes; the tree's idle CPU rate is subtracted over each sample's wall time. Median over repetitions,")
        add("interleaved. Targets: save <= 1.25x (TQ get + raw write); restore <= 1.25x (TQ put + raw read).")
        add('"restore before" = the restore before issue 30 (each part read whole into a fresh buffer), interleaved.')
        add("")
        add(
            "| units | live MiB | save | TQ get | raw write | **save x (get + write)** | restore | restore before "
            "| TQ put | raw read | **restore x (put + read)** | before x | save by process | restore by process |"
        )
        add("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            c = r["cpu"]
            cols = [_f(c[k]["cpu_s_per_gib"]) for k in ("save", "tq_get", "raw_write")]
            back = [_f(c[k]["cpu_s_per_gib"]) if k in c else "—" for k in ("restore", "restore_before", "tq_put")]
            add(
                f"| {r['units']} | {r['size_mib']} | {' | '.join(cols)} | **{_f(c.get('save_over_baseline'))}** | "
                f"{' | '.join(back)} | {_f(c['raw_read']['cpu_s_per_gib'])} | "
                f"**{_f(c.get('restore_over_baseline'))}** | {_f(c.get('restore_before_over_baseline'))} | "
                f"{_roles(c['save'])} | {_roles(c['restore'])} |"
            )
        add("")
    stages = res.get("stages")
    if stages:
        add(f"### Stage costs alone (CPU-ms per MiB, one thread, {stages['mib']} MiB, median of {stages['reps']})")
        add("")
        add("| " + " | ".join(stages["cpu_ms_per_mib"]) + " |")
        add("|" + "---|" * len(stages["cpu_ms_per_mib"]))
        add("| " + " | ".join(_f(v, 3) for v in stages["cpu_ms_per_mib"].values()) + " |")
        add("")
    _policy(res.get("policy_save"), add)
    run = res.get("hf_run")
    if run and "lost_share" in run:
        add("### Training time lost to checkpointing, hf backend (~20 M-parameter Llama on CPU, in-run accounting)")
        add("")
        add("| steps | median step s | saves | save s | paused per save s | lost s / span s | **lost** |")
        add("|---|---|---|---|---|---|---|")
        saves = ", ".join(f"{s:.2f}" for s in run["save_s"])
        paused = ", ".join(f"{s:.3f}" for s in run["blocked_s"])
        add(
            f"| {run['steps']} | {run['step_s']:.2f} | {run['saves']} | {saves} | {paused} | "
            f"{run['lost_s']:.2f} / {run['span_s']:.1f} | **{100 * run['lost_share']:.2f} %** |"
        )
        add("")


def _policy(doc: dict[str, Any] | None, add: Any) -> None:
    if not doc or "results" not in doc:
        return
    add("### hf policy save (DCP): CPU-seconds per GiB against a raw write, and the pause per 100 MiB")
    add("")
    add(
        "| model | ranks | policy MiB | DCP CPU-s/GiB | raw CPU-s/GiB | **x raw** | before (issue 30) x raw "
        "| **paused ms / 100 MiB** |"
    )
    add("|---|---|---|---|---|---|---|---|")
    for name, entry in doc["results"].items():
        for w in entry["worlds"]:
            add(
                f"| {name} | {w['world']} | {w['bytes'] / 2**20:.0f} | {_f(w['cpu_s_per_gib_dcp']['median'])} | "
                f"{_f(w['cpu_s_per_gib_raw']['median'])} | **{_f(w['cpu_dcp_over_raw'])}** | "
                f"{_f(w.get('cpu_dcp_before_over_raw'))} | "
                f"**{_f(w['paused_ms_per_100mib']['median'], 1)}** |"
            )
    add("")


def targets(res: dict[str, Any], add: Any) -> None:
    """``add(target, shown, ok, values)`` for each CPU target measured in ``res``."""
    rows = [r for r in res.get("data_plane") or [] if "cpu" in r and r["size_mib"] >= 64]
    for units in sorted({r["units"] for r in rows}):
        mine = [r for r in rows if r["units"] == units]
        for what, limit, base in (
            ("save", SAVE_TARGET, "TQ get + raw write"),
            ("restore", RESTORE_TARGET, "TQ put + raw read"),
        ):
            vals = [r["cpu"][f"{what}_over_baseline"] for r in mine]
            shown = ", ".join(f"{r['size_mib']} MiB {v:.2f}x" for r, v in zip(mine, vals, strict=True))
            add(f"{what} CPU-s/GiB <= {limit}x ({base}), >= 64 MiB, {units} unit(s)", shown, max(vals) <= limit, vals)
    run = res.get("hf_run")
    if run and "lost_share" in run:
        v = run["lost_share"]
        add(
            "training time lost to checkpointing <= 1%, hf ~20M Llama, save every 10 steps",
            f"{100 * v:.2f} %",
            v <= LOST_TARGET,
            [v],
        )
    doc = res.get("policy_save") or {}
    worlds = [(name, w) for name, e in (doc.get("results") or {}).items() for w in e["worlds"]]
    if worlds:
        vals = [w["cpu_dcp_over_raw"] for _, w in worlds]
        shown = ", ".join(f"{n} {w['world']} rank(s) {w['cpu_dcp_over_raw']:.2f}x" for n, w in worlds)
        add(
            f"policy save (DCP) CPU-s/GiB <= {POLICY_TARGET}x raw write, 1 and 2 ranks",
            shown,
            max(vals) <= POLICY_TARGET,
            vals,
        )
        pauses = [w["paused_ms_per_100mib"]["median"] for _, w in worlds]
        shown = ", ".join(f"{n} {w['world']} rank(s) {p:.1f} ms" for (n, w), p in zip(worlds, pauses, strict=True))
        add(
            f"training paused per save <= {PAUSE_MS_PER_100MIB:g} ms per 100 MiB of trainer state",
            shown,
            max(pauses) <= PAUSE_MS_PER_100MIB,
            pauses,
        )
