"""PNG plots of one run, beside ``latest.md``: saves/restores vs their ceilings, bundle size and commit stall, where a
step's time goes, and data-plane calls vs TransferQueue's own client plus the resume times."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.scbench.report import PHASE_ORDER


def plot(res: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    dp = res.get("data_plane") or []
    if dp:
        made += [_throughput(plt, dp, out), _stall_and_size(plt, dp, out)]
    e = res.get("end_to_end")
    if e:
        made.append(_phases(plt, e, out))
    pg = res.get("put_get")
    if e or pg:
        made.append(_controller_and_putget(plt, e, pg, out))
    return made


def _series(
    dp: list[dict[str, Any]], units: int, get: Callable[[dict[str, Any]], float | None]
) -> tuple[list[int], list[float]]:
    """(size MiB, value) of every data-plane row of ``units`` units whose value exists."""
    xs, ys = [], []
    for r in dp:
        if r["units"] != units:
            continue
        try:
            v = get(r)
        except (KeyError, TypeError):
            v = None
        if v is not None:
            xs.append(r["size_mib"])
            ys.append(v)
    return xs, ys


def _throughput(plt: Any, dp: list[dict[str, Any]], out: Path) -> str:
    """Saves and restores against their ceilings, per size and unit count."""

    def series(units: int, get: Callable[[dict[str, Any]], float | None]) -> tuple[list[int], list[float]]:
        return _series(dp, units, get)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, what, ceiling in (
        (axes[0], "save", "save_ceiling_mib_s"),
        (axes[1], "restore", "restore_ceiling_mib_s"),
    ):
        for units, ls in ((1, "-"), (2, "--")):
            ax.plot(*series(units, lambda r, c=ceiling: r[c]["median"]), "k" + ls, label=f"ceiling, {units} unit(s)")
            ax.plot(
                *series(units, lambda r, w=what: r["streamed"][f"{w}_mib_s"]["median"]),
                "C0o" + ls,
                label=f"streamed, {units} unit(s)",
            )
            ax.plot(
                *series(units, lambda r, w=what: r["before"][f"{w}_mib_s"]["median"]),
                "C1^" + ls,
                label=f"before, {units} unit(s)",
            )
        ax.plot(*series(1, lambda r, w=what: r["native"][f"{w}_mib_s"]["median"]), "C3s:", label="native, 1 unit")
        ax.set(xscale="log", xlabel="live data-plane MiB", ylabel="MiB/s of live bytes", title=what)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    return "throughput.png"


def _stall_and_size(plt: Any, dp: list[dict[str, Any]], out: Path) -> str:
    """Bundle bytes over live bytes, and the barrier window and p99 commit wait during a save."""

    def series(units: int, get: Callable[[dict[str, Any]], float | None]) -> tuple[list[int], list[float]]:
        return _series(dp, units, get)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    ax.plot(*series(1, lambda r: r["streamed"]["bundle_over_live"]), "C0o-", label="streamed")
    ax.plot(*series(1, lambda r: r["native"]["bundle_over_live"]), "C3s-", label="native")
    ax.axhline(1.1, color="k", ls=":", label="target 1.1x")
    ax.set(xscale="log", xlabel="live data-plane MiB", ylabel="bundle bytes / live bytes", title="bundle size")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax = axes[1]
    ax.plot(*series(1, lambda r: r["streamed"]["window_ms"]["median"]), "C0o-", label="window, streamed")
    ax.plot(*series(1, lambda r: r["native"]["window_ms"]["median"]), "C3s-", label="window, native")
    ax.plot(*series(1, lambda r: r["streamed"]["commit_wait_ms"]["p99"]), "C0^:", label="p99 commit wait, streamed")
    ax.plot(*series(1, lambda r: r["native"]["commit_wait_ms"]["p99"]), "C3v:", label="p99 commit wait, native")
    ax.axhline(50, color="k", ls=":", label="50 ms")
    ax.set(xscale="log", yscale="log", xlabel="live data-plane MiB", ylabel="ms", title="commit stall during a save")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "stall_and_size.png", dpi=110)
    plt.close(fig)
    return "stall_and_size.png"


def _phases(plt: Any, e: dict[str, Any], out: Path) -> str:
    """Where a train step's time goes, per configuration."""
    real = e.get("realistic") or {}
    cols = [("default", e.get("phases_default")), ("realistic\nnow", real.get("now"))]
    cols += [("realistic\nbefore", real.get("before"))]
    cols = [(n, c) for n, c in cols if c]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    critical = ("wait_rollouts", "get", "advantage_write", "trainer", "clear", "weight_sync", "controller")
    for i, (_name, c) in enumerate(cols):
        bottom = 0.0
        total = c["step_s"]
        for j, key in enumerate(k for k in PHASE_ORDER if k in critical):
            share = 100 * c["phases"][key] / total if total else 0.0
            ax.bar(i, share, bottom=bottom, color=f"C{j}", label=key if i == 0 else None)
            bottom += share
        ax.plot(i, 100 * c["data_plane_share"], "k*", ms=12, label="data-plane ops" if i == 0 else None)
    ax.axhline(10, color="k", ls=":", label="10 % target")
    ax.set_xticks(range(len(cols)), [n for n, _ in cols])
    ax.set(ylabel="% of step time", title="where a train step's time goes")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(out / "phases.png", dpi=110)
    plt.close(fig)
    return "phases.png"


def _controller_and_putget(plt: Any, e: dict[str, Any] | None, pg: list[dict[str, Any]] | None, out: Path) -> str:
    """Data-plane calls against TransferQueue's own client, and the time to the first trained step."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if pg:
        ax = axes[0]
        for row_bytes, marker in ((1024, "o"), (1024 * 1024, "s")):
            ps = [p for p in pg if p["row_bytes"] == row_bytes]
            label = "1 KiB" if row_bytes == 1024 else "1 MiB"
            xs = [p["groups_per_call"] for p in ps]
            ax.plot(
                xs,
                [p["adapter_put"]["rows_s"]["median"] for p in ps],
                f"C0{marker}-",
                label=f"adapter put, {label}",
            )
            ax.plot(xs, [p["tq_put"]["rows_s"]["median"] for p in ps], f"k{marker}--", label=f"TQ put, {label}")
            ax.plot(
                xs,
                [p["adapter_get"]["rows_s"]["median"] for p in ps],
                f"C2{marker}-",
                label=f"adapter get, {label}",
            )
            ax.plot(xs, [p["tq_get"]["rows_s"]["median"] for p in ps], f"C2{marker}:", label=f"TQ get, {label}")
        ax.set(xscale="log", yscale="log", xlabel="groups (8 rows) per call", ylabel="rows/s", title="data-plane calls")
        ax.legend(fontsize=7)
    if e:
        ax = axes[1]
        names, vals, colors = [], [], []
        if "cold_first_step_s" in e:
            names += ["cold", "resume"]
            vals += [e["cold_first_step_s"]["median"], e["resume_first_step_s"]["median"]]
            colors += ["0.6", "C0"]
        b = e["resume_big"]
        names += [f"resume, {b['data_plane_mib']:.0f} MiB\n(after verify)", "bundle verify"]
        vals += [b["first_step_after_verify_s"], b["verify_s"]]
        colors += ["C2", "C1"]
        ax.bar(names, vals, color=colors)
        if "budget_s" in b:
            ax.axhline(b["budget_s"], color="k", ls=":", label="target for the padded resume")
            ax.legend(fontsize=8)
        ax.set(ylabel="seconds", title="time to first trained step")
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(out / "controller_and_putget.png", dpi=110)
    plt.close(fig)
    return "controller_and_putget.png"
