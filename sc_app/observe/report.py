"""``sc-app report``: PNG plots and a short Markdown summary from a run log — no cluster, no TensorBoard needed.

Plots (each series is the effective one: one record per step, the newest attempt's):
* ``reward_loss.png`` — reward mean with its min-max band, and loss, per step; resumes as vertical lines, published
  bundles as dots on the reward line (emergency bundles as crosses);
* ``step_time.png``   — seconds per step, with the same marks;
* ``saves.png``       — per published bundle: its whole time, and the pause and barrier window training saw;
* ``goodput.png``     — where each attempt's wall time went (``sc_app.observe.goodput``; table in ``report.md``).

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, no global state, no display). Every plotted
artist carries a ``gid`` naming its series, so tests can compare what was plotted with the log.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from sc_app.observe import goodput_report
from sc_app.observe.goodput import ledger
from sc_app.observe.reader import RunHistory
from sc_app.observe.records import LoggedEvent, LoggedStep, finite

FIGURES = ("reward_loss", "step_time", "saves", "goodput")
SUMMARY_FILE = "report.md"
EDGE = 10  # steps averaged for the first/last reward


@dataclass(frozen=True)
class Marks:
    """Where resumes and published bundles happened, by step."""

    resumes: list[tuple[int, str]]  # (step resumed from, label)
    saves: list[int]
    emergency_saves: list[int]

    @classmethod
    def of(cls, h: RunHistory) -> Marks:
        resumes = [
            (int(e.step), f"attempt {e.stamp.attempt}: resumed from {e.data.get('bundle', f'step_{e.step}')}")
            for e in h.events_named("resume")
            if e.step is not None
        ]
        saves = [int(e.step) for e in h.events_named("save") if e.step is not None]
        emergency = [int(e.step) for e in h.events_named("emergency_save") if e.step is not None]
        return cls(resumes, saves, emergency)


@dataclass(frozen=True)
class Summary:
    log: str
    attempts: list[dict[str, Any]]
    first_step: int | None
    last_step: int | None
    steps_logged: int  # distinct steps
    redone_lines: int  # step lines of a step an earlier attempt had already trained
    missing_steps: list[int]  # between 1 and the last step, logged by no attempt (the first MISSING_LISTED)
    reward_first: float | None  # mean over the first EDGE effective steps
    reward_last: float | None
    step_seconds_median: float | None
    step_seconds_p90: float | None
    saves: int
    emergency_saves: int
    failed_saves: int
    save_seconds_median: float | None
    save_seconds_max: float | None
    save_window_ms_max: float | None
    save_paused_ms_max: float | None
    bundle_bytes_last: int | None
    preemption_notice_s: float | None  # the newest attempt's checkpoint.preemption_notice_s (start event)
    saves_over_notice: list[int]  # steps of published bundles whose save took longer than that notice
    resumes: list[dict[str, Any]]
    dropped_records: int
    unreadable_lines: int
    goodput: dict[str, Any] = field(default_factory=dict)  # the run's ledger (sc_app.observe.goodput), as_event()
    remote: dict[str, Any] = field(default_factory=dict)  # checkpoint.remote: uploads, failed, seconds max, lag
    missing_count: int = 0  # every missing step, however many
    files: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def _quantile(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if math.isfinite(x))
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _num(e: LoggedEvent, key: str) -> float | None:
    v = e.data.get(key)
    return float(v) if isinstance(v, int | float) else None


def summarize(h: RunHistory) -> Summary:
    eff = h.effective_steps()
    saves = h.saves()
    seconds = [v for e in saves if (v := _num(e, "seconds")) is not None]
    windows = [v for e in saves if (v := _num(e, "window_seconds")) is not None]
    paused = [v for e in saves if (v := _num(e, "paused_seconds")) is not None]
    sizes = [int(v) for e in saves if (v := _num(e, "bytes")) is not None]
    dropped = sum(
        int(_num(e, k) or 0) for e in h.events_named("dropped") for k in ("steps", "events", "write_failed")
    )  # a field that is not a number (someone else's line) counts as nothing, never a crash
    notices = [_num(e, "preemption_notice_s") for e in h.events_named("start")]
    notice = notices[-1] if notices else None
    return Summary(
        log=str(h.path),
        attempts=[asdict(a) for a in h.attempts()],
        first_step=eff[0].step if eff else None,
        last_step=eff[-1].step if eff else None,
        steps_logged=len(eff),
        redone_lines=sum(1 for s in h.steps if s.redone),
        missing_steps=h.missing_steps(),
        missing_count=h.missing_count(),
        reward_first=_mean([s.record.reward_mean for s in eff[:EDGE]]),
        reward_last=_mean([s.record.reward_mean for s in eff[-EDGE:]]),
        step_seconds_median=statistics.median([s.record.step_seconds for s in eff]) if eff else None,
        step_seconds_p90=_quantile([s.record.step_seconds for s in eff], 0.9),
        saves=len(saves),
        emergency_saves=len(h.events_named("emergency_save")),
        failed_saves=len(h.events_named("save_failed")),
        save_seconds_median=statistics.median(seconds) if seconds else None,
        save_seconds_max=max(seconds, default=None),
        save_window_ms_max=max(windows) * 1000 if windows else None,
        save_paused_ms_max=max(paused) * 1000 if paused else None,
        bundle_bytes_last=sizes[-1] if sizes else None,
        preemption_notice_s=notice,
        saves_over_notice=[int(e.step or 0) for e in saves if notice is not None and (_num(e, "seconds") or 0) > notice]
        if notice is not None else [],
        resumes=[
            {"attempt": e.stamp.attempt, "step": e.step, "bundle": e.data.get("bundle"), "reason": e.data.get("reason")}
            for e in h.events_named("resume")
        ],
        dropped_records=dropped,
        unreadable_lines=h.skipped,
        goodput=ledger(h).as_event(),
        remote=_remote(h),
    )


def _remote(h: RunHistory) -> dict[str, Any]:
    """The remote tier's uploads (``upload`` / ``upload_failed`` events); empty when the run had none."""
    ups, failed = h.events_named("upload"), h.events_named("upload_failed")
    if not ups and not failed:
        return {}
    seconds = [v for e in ups if (v := _num(e, "seconds")) is not None]
    out: dict[str, Any] = {"uploads": len(ups), "failed": len(failed), "seconds_max": max(seconds, default=None)}
    out["bytes"] = sum(int(_num(e, "bytes") or 0) for e in ups)
    out["lag_steps_last"] = _num(sorted(ups + failed, key=lambda e: e.stamp.t)[-1], "lag_steps")
    out["newest_step"] = max((int(e.step or 0) for e in ups), default=None)
    return out


# ---------------------------------------------------------------------------------------------- figures
def _value_at(eff: dict[int, LoggedStep], steps: list[int], attr: str) -> tuple[list[int], list[float]]:
    xs = [s for s in steps if s in eff]
    return xs, [float(getattr(eff[s].record, attr)) for s in xs]


def _mark(ax: Any, eff: dict[int, LoggedStep], marks: Marks, attr: str, *, legend: bool) -> None:
    for step, label in marks.resumes:
        ax.axvline(step, color="tab:red", linestyle="--", linewidth=1, gid="resume", label=label if legend else None)
    xs, ys = _value_at(eff, marks.saves, attr)
    ax.scatter(xs, ys, s=14, color="tab:green", zorder=3, gid="saves", label="bundle published" if legend else None)
    xs, ys = _value_at(eff, marks.emergency_saves, attr)
    if xs:
        ax.scatter(
            xs,
            ys,
            s=40,
            marker="X",
            color="tab:orange",
            zorder=4,
            gid="emergency_saves",
            label="emergency bundle (SIGTERM)" if legend else None,
        )


def _empty(fig: Figure, text: str) -> Figure:
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def build_figures(h: RunHistory) -> dict[str, Figure]:
    """The report's figures, keyed by ``FIGURES`` names."""
    marks = Marks.of(h)
    return {
        "reward_loss": reward_loss_figure(h.effective_steps(), marks),
        "step_time": step_time_figure(h.effective_steps(), marks),
        "saves": saves_figure(h.saves()),
        "goodput": goodput_figure(h),
    }


def reward_loss_figure(eff_list: list[LoggedStep], marks: Marks) -> Figure:
    """Reward mean with its min-max band, and loss, per step."""
    fig = Figure(figsize=(10, 6.5), layout="constrained")
    if not eff_list:
        _empty(fig, "no train step in the run log")
        return fig
    eff = {s.step: s for s in eff_list}
    steps = [s.step for s in eff_list]
    ax_r, ax_l = fig.subplots(2, 1, sharex=True)
    ax_r.fill_between(
        steps,
        [s.record.reward_min for s in eff_list],
        [s.record.reward_max for s in eff_list],
        color="tab:blue",
        alpha=0.15,
        gid="reward_range",
        label="reward min-max",
    )
    ax_r.plot(steps, [s.record.reward_mean for s in eff_list], color="tab:blue", gid="reward_mean", label="reward")
    _mark(ax_r, eff, marks, "reward_mean", legend=True)
    ax_r.set_ylabel("reward")
    ax_r.legend(loc="lower right", fontsize="small")
    ax_l.plot(steps, [s.record.loss for s in eff_list], color="tab:purple", gid="loss", label="loss")
    _mark(ax_l, eff, marks, "loss", legend=False)
    ax_l.set_ylabel("loss")
    ax_l.set_xlabel("train step")
    fig.suptitle("Reward and loss per step")
    return fig


def step_time_figure(eff_list: list[LoggedStep], marks: Marks) -> Figure:
    fig = Figure(figsize=(10, 4), layout="constrained")
    if not eff_list:
        _empty(fig, "no train step in the run log")
        return fig
    eff = {s.step: s for s in eff_list}
    steps = [s.step for s in eff_list]
    ax = fig.add_subplot()
    ax.plot(steps, [s.record.step_seconds for s in eff_list], color="tab:gray", gid="step_seconds", label="step")
    _mark(ax, eff, marks, "step_seconds", legend=True)
    ax.set_ylabel("seconds per step")
    ax.set_xlabel("train step")
    ax.legend(loc="upper right", fontsize="small")
    fig.suptitle("Step time")
    return fig


def saves_figure(saves: list[LoggedEvent]) -> Figure:
    """Per published bundle: its whole time (emergency bundles marked), and the pause and window training saw."""
    fig = Figure(figsize=(10, 6), layout="constrained")
    if not saves:
        _empty(fig, "no bundle published in the run log")
        return fig
    xs = [int(e.step or 0) for e in saves]
    ax_s, ax_w = fig.subplots(2, 1, sharex=True)
    ax_s.plot(
        xs,
        [_num(e, "seconds") for e in saves],
        "o-",
        color="tab:green",
        gid="save_seconds",
        label="whole save (behind training)",
    )
    em = [e for e in saves if e.name == "emergency_save"]
    if em:
        ax_s.scatter(
            [e.step for e in em],
            [_num(e, "seconds") for e in em],
            s=60,
            marker="X",
            color="tab:orange",
            zorder=3,
            gid="emergency_save_seconds",
            label="emergency bundle",
        )
    ax_s.set_ylabel("seconds")
    ax_s.legend(loc="upper left", fontsize="small")
    for key, style, color, gid, label in (
        ("paused_seconds", "s-", "tab:red", "paused_ms", "training paused"),
        ("window_seconds", "o-", "tab:blue", "window_ms", "barrier window"),
    ):
        ax_w.plot(xs, [1000 * (_num(e, key) or math.nan) for e in saves], style, color=color, gid=gid, label=label)
    ax_w.set_ylabel("milliseconds")
    ax_w.set_xlabel("train step of the bundle")
    ax_w.legend(loc="upper left", fontsize="small")
    fig.suptitle("Saves: duration, pause and window per published bundle")
    return fig


def goodput_figure(h: RunHistory) -> Figure:
    """Where the run's wall time went (the goodput ledger), with the faults' costs."""
    return goodput_report.figure(ledger(h))


# ---------------------------------------------------------------------------------------------- files
def _remote_lines(r: dict[str, Any]) -> list[str]:
    if not r:
        return []
    return [
        f"- remote tier: {r['uploads']} bundles uploaded ({r['bytes'] / 2**20:.1f} MiB), {r['failed']} failed "
        f"uploads (retried); newest on the bucket step_{r['newest_step']}, upload max "
        f"{_fmt(r['seconds_max'], ' s')}, last lag {r['lag_steps_last']} steps"
    ]


def _fmt(v: float | None, unit: str = "", digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}f}{unit}"


def markdown(s: Summary, h: RunHistory | None = None) -> str:
    lines = [
        "# sc-app run report",
        "",
        f"Run log: `{s.log}`",
        "",
        f"- steps: {s.first_step} → {s.last_step} ({s.steps_logged} distinct, {s.redone_lines} redone after a "
        f"resume, {s.missing_count} missing)",
        f"- reward: {_fmt(s.reward_first)} (first {EDGE} steps) → {_fmt(s.reward_last)} (last {EDGE} steps)",
        f"- step time: median {_fmt(s.step_seconds_median, ' s')}, p90 {_fmt(s.step_seconds_p90, ' s')}",
        f"- bundles published: {s.saves} ({s.emergency_saves} on SIGTERM), {s.failed_saves} failed saves; "
        f"save median {_fmt(s.save_seconds_median, ' s')}, max {_fmt(s.save_seconds_max, ' s')}; "
        f"training paused at most {_fmt(s.save_paused_ms_max, ' ms', 1)}, window at most "
        f"{_fmt(s.save_window_ms_max, ' ms', 1)}",
        f"- run-log records lost (slow volume): {s.dropped_records}; unreadable lines: {s.unreadable_lines}",
        *_notice_lines(s),
        *_remote_lines(s.remote),
        "",
        "| attempt | run id | from step | resumed from | final step | exit code |",
        "|---|---|---|---|---|---|",
    ]
    for a in s.attempts:
        lines.append(
            f"| {a['attempt']} | {a['run_id']} | {a['start_step'] if a['start_step'] is not None else '—'} | "
            f"{a['resumed_from'] or 'fresh'} | {a['final_step'] if a['final_step'] is not None else '—'} | "
            f"{a['exit_code'] if a['exit_code'] is not None else 'none logged (killed?)'} |"
        )
    if s.missing_steps:
        shown = ", ".join(map(str, s.missing_steps[:20])) + (" …" if s.missing_count > 20 else "")
        lines += ["", f"Missing steps: {shown}"]
    lines.append("")
    if h is not None:
        lines += goodput_report.markdown_lines(ledger(h))
    for name in FIGURES:
        if name in s.files:
            lines.append(f"![{name}]({Path(s.files[name]).name})")
    return "\n".join(lines) + "\n"


def _notice_lines(s: Summary) -> list[str]:
    """The warning when saves take longer than the platform's preemption notice (checkpoint.preemption_notice_s)."""
    if not s.saves_over_notice or s.preemption_notice_s is None:
        return []
    steps = ", ".join(f"step_{n}" for n in s.saves_over_notice[:10]) + (" …" if len(s.saves_over_notice) > 10 else "")
    return [
        f"- **warning**: {len(s.saves_over_notice)} saves took longer than checkpoint.preemption_notice_s="
        f"{s.preemption_notice_s:g} s ({steps}): an emergency bundle cannot finish within a preemption notice, so "
        "checkpoint.save_period is the real protection",
    ]


def write_report(h: RunHistory, out_dir: str | Path) -> Summary:
    """Write the PNGs and ``report.md`` into ``out_dir``; returns the summary with the files' paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    for name, fig in build_figures(h).items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        files[name] = str(path)
    summary = replace(summarize(h), files=files)
    md = out / SUMMARY_FILE
    md.write_text(markdown(summary, h))
    return replace(summary, files={**files, "summary": str(md)})


def summary_json(s: Summary) -> str:
    """The summary for scripts (``--json``): non-finite numbers as null."""
    return json.dumps(finite(s.as_dict()), indent=2, allow_nan=False, default=str)
