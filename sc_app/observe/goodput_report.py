"""``sc-app report``'s goodput part: a Markdown table and a stacked-bar plot of ``sc_app.observe.goodput.ledger``.

The plot (``goodput.png``) has one bar per attempt (and one for the time between attempts), each split into the
ledger's buckets; every bar segment carries ``gid`` ``<bucket>@<attempt>`` so tests can compare it with the ledger.
"""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from sc_app.observe.goodput import BUCKETS, LABELS, Ledger

COLORS = {
    "training": "tab:green",
    "startup": "tab:gray",
    "restore": "tab:purple",
    "saves": "tab:blue",
    "recoveries": "tab:orange",
    "redone": "tab:red",
    "between_attempts": "black",
    "other": "tab:olive",
}


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.1f}%"


def markdown_lines(led: Ledger) -> list[str]:
    """The goodput section of ``report.md``: per attempt and for the run, seconds by bucket; fault costs."""
    shown = [b for b in BUCKETS if led.seconds[b] > 0 or b == "training"]
    head = "| attempt | wall s | goodput | " + " | ".join(f"{LABELS[b]} s" for b in shown) + " |"
    lines = ["## Goodput", "", led.line(), "", head, "|" + "---|" * (3 + len(shown))]
    for a in led.attempts:
        cells = " | ".join(f"{a.seconds.get(b, 0.0):.1f}" for b in shown)
        lines.append(
            f"| {a.attempt}{' (resumed)' if a.resumed else ''} | {a.wall_s:.1f} | {_pct(a.goodput)} | {cells} |"
        )
    cells = " | ".join(f"**{led.seconds[b]:.1f}**" for b in shown)
    lines.append(f"| **run** | **{led.wall_s:.1f}** | **{_pct(led.goodput)}** | {cells} |")
    f = led.faults
    lines += ["", f"Faults: {f.count}; job retries (attempts resumed after a failed one): {led.job_retries}."]
    if f.count:
        lines.append(
            f"In-job recovery seconds: median {f.recovery_s_median:.3f}, max {f.recovery_s_max:.3f}; detection at "
            f"most {f.detection_s_max:.3f} s; steps redone {f.steps_redone}, rollouts regenerated "
            f"{f.rollouts_regenerated}, prompts lost {f.prompts_lost}, prompts duplicated {f.prompts_duplicated}."
        )
        lines += ["", "| fault | outcome | count |", "|---|---|---|"]
        for key, n in f.by_kind.items():
            kind, _, outcome = key.partition(" ")
            lines.append(f"| {kind} | {outcome} | {n} |")
    return [*lines, ""]


def figure(led: Ledger) -> Figure:
    fig = Figure(figsize=(9, 4.5))
    ax = fig.add_subplot(1, 1, 1)
    bars: list[tuple[str, dict[str, float]]] = [
        (f"attempt {a.attempt}", {**a.seconds, "between_attempts": 0.0}) for a in led.attempts
    ]
    if led.seconds["between_attempts"] > 0:
        bars.append(("between", {**dict.fromkeys(BUCKETS, 0.0), "between_attempts": led.seconds["between_attempts"]}))
    if not bars:
        ax.text(0.5, 0.5, "no attempt in the run log", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return fig
    labelled: set[str] = set()
    for i, (name, seconds) in enumerate(bars):
        bottom = 0.0
        for b in BUCKETS:
            v = seconds.get(b, 0.0)
            if v <= 0:
                continue
            kw: dict[str, Any] = {"label": LABELS[b]} if b not in labelled else {}
            labelled.add(b)
            (rect,) = ax.bar(i, v, bottom=bottom, color=COLORS[b], **kw)
            rect.set_gid(f"{b}@{name}")
            bottom += v
    ax.set_xticks(range(len(bars)), [n for n, _ in bars])
    ax.set_ylabel("wall seconds")
    if labelled:
        ax.legend(loc="upper right", fontsize="small")
    fig.suptitle(f"Where the wall time went: goodput {_pct(led.goodput)} of {led.wall_s:.1f} s")
    return fig
