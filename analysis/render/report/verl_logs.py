"""Phase tables from VeRL's logs, rendered: CSV files, the Markdown and terminal tables, the figure.

Everything here takes the finished frames of :mod:`analysis.workload.verl_logs`; nothing computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from ...workload import verl_logs as wl
from ...workload.verl_logs import OTHER, STEP
from .units import fixed

if TYPE_CHECKING:
    import matplotlib.pyplot as plt
    import numpy as np
    from rich.table import Table

    from ..outputs.files import OutputSession

#: the figure's size in inches, whatever the number of steps (bars are binned past ``max_bars``)
FIGURE_SIZE = (10.0, 5.0)
_OTHER_COLOR = "#d0d0d0"
#: for phases the project gives no color (save_checkpoint, gen_max, a release's new stages)
_SPARE_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#1f77b4", "#9467bd", "#8c564b", "#d62728")


def _seconds(value: float | None) -> str:
    return "" if value is None else fixed(value, 3)


def _pct(value: float | None) -> str:
    return "" if value is None else fixed(value, 1, pct=True) + "%"


def _summary_rows(summary: pl.DataFrame) -> list[tuple[str, ...]]:
    """``phase, steps, median s, p10–p90 s, share, share p10–p90`` as text, one tuple per row."""
    return [
        (
            row["phase"],
            str(row["n_steps"]),
            _seconds(row["median_s"]),
            f"{_seconds(row['p10_s'])}–{_seconds(row['p90_s'])}",
            _pct(row["share_median_pct"]),
            ""
            if row["share_p10_pct"] is None
            else f"{_pct(row['share_p10_pct'])}–{_pct(row['share_p90_pct'])}",
        )
        for row in summary.iter_rows(named=True)
    ]


SUMMARY_HEADER = (
    "phase",
    "steps",
    "median s",
    "p10–p90 s",
    "share of step (median over steps)",
    "share p10–p90",
)
#: what the share column is, under the printed and the Markdown table
SHARE_NOTE = (
    "share of step: per step, a phase's seconds / the step's seconds; median and p10–p90 over "
    "the steps it ran in (medians need not add up to 100%)"
)


def summary_title(times: pl.DataFrame) -> str:
    """``VeRL phase times: N steps (first–last)``."""
    steps = times["step"].unique().sort().to_list()
    if not steps:
        return "VeRL phase times: no steps"
    return f"VeRL phase times: {len(steps)} steps ({steps[0]}–{steps[-1]})"


def summary_markdown(summary: pl.DataFrame, title: str, note: str | None = None) -> str:
    """The per-phase table (median, p10–p90, share of step) as Markdown; ``note`` below it."""
    lines = [
        f"# {title}",
        "",
        "| " + " | ".join(SUMMARY_HEADER) + " |",
        "|---|" + "---:|" * (len(SUMMARY_HEADER) - 1),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _summary_rows(summary)]
    lines += [
        "",
        f"Seconds over the steps a phase ran in. {SHARE_NOTE[0].upper()}{SHARE_NOTE[1:]}. "
        f"`{OTHER}`: the step's time no phase timer covers. `<0.001`, `<0.1%`: nonzero, under "
        "the column's last digit.",
        *([] if note is None else ["", f"Note: {note}."]),
    ]
    return "\n".join(lines) + "\n"


def summary_rich_table(summary: pl.DataFrame, title: str) -> Table:
    """The per-phase table for the terminal (names as text, never markup)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=title,
        caption=SHARE_NOTE,
        header_style="bold",
    )
    for i, name in enumerate(SUMMARY_HEADER):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for phase, *cells in _summary_rows(summary):
        style = "bold" if phase == STEP else "dim" if phase == OTHER else ""
        table.add_row(Text(phase, style=style), *cells)
    return table


def write_csv_tables(
    session: OutputSession, times: pl.DataFrame, steps: pl.DataFrame, summary: pl.DataFrame
) -> list[Path]:
    """``phase_times.csv``, ``steps.csv`` and ``phase_summary.csv`` into the session's folder."""
    return [
        session.write("phase_times.csv", times.write_csv),
        session.write("steps.csv", steps.write_csv),
        session.write("phase_summary.csv", summary.write_csv),
    ]


def share_bars(times: pl.DataFrame, *, max_bars: int = 40) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What the share figure draws, at most ``max_bars`` bars of consecutive steps.

    ``shares``: ``bar, phase, share`` for every bar and phase: the phase's share of the step
    (:func:`~analysis.workload.verl_logs.step_shares`, as a fraction), of a bin its mean over
    the bin's steps (0 where the phase did not run); phases in execution order, then
    :data:`~analysis.workload.verl_logs.OTHER`; each bar adds up to 1 (more where timers
    overlap). ``bars``: ``bar, label`` (the step, or ``first–last``), ``n_steps`` and the step
    time's ``median_s``, ``p10_s``, ``p90_s``.
    """
    totals = wl.step_totals(times)
    n = totals.height
    binned = totals.with_row_index("_i").with_columns(
        (pl.col("_i").cast(pl.Int64) * min(max_bars, max(n, 1)) // max(n, 1)).alias("bar")
    )
    bars = (
        binned.group_by("bar")
        .agg(
            pl.col("step").min().alias("_first"),
            pl.col("step").max().alias("_last"),
            pl.len().alias("n_steps"),
            pl.col("step_s").median().alias("median_s"),
            pl.col("step_s").quantile(0.1, "linear").alias("p10_s"),
            pl.col("step_s").quantile(0.9, "linear").alias("p90_s"),
        )
        .sort("bar")
        .with_columns(
            pl.when(pl.col("_first") == pl.col("_last"))
            .then(pl.col("_first").cast(pl.String))
            .otherwise(pl.format("{}–{}", "_first", "_last"))
            .alias("label")
        )
    )
    per_step = wl.step_shares(times).filter(pl.col("phase") != STEP)
    other = [OTHER] if (per_step["phase"] == OTHER).any() else []  # not seen without step timers
    order = [*(p for p in wl.ordered_phases(times) if p != STEP), *other]
    grid = binned.select("step", "bar").join(pl.DataFrame({"phase": order}), how="cross")
    shares = wl.in_order(
        grid.join(per_step, on=["step", "phase"], how="left")
        .group_by("bar", "phase")
        .agg((pl.col("share_pct").fill_null(0.0).mean() / 100).alias("share")),
        order,
        "bar",
    ).select("bar", "phase", "share")
    return shares, bars.select("bar", "label", "n_steps", "median_s", "p10_s", "p90_s")


def _colors(phases: list[str]) -> dict[str, str]:
    """The project's phase colors; phases without one get distinct colors in turn."""
    from nvtx_phases.naming import PHASE_COLORS

    spare = iter(_SPARE_COLORS * (1 + len(phases) // len(_SPARE_COLORS)))
    return {
        phase: _OTHER_COLOR
        if phase == OTHER
        else f"#{PHASE_COLORS[phase] & 0xFFFFFF:06x}"
        if phase in PHASE_COLORS
        else next(spare)
        for phase in phases
    }


def phase_share_figure(shares: pl.DataFrame, bars: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars: each phase's share of the step (adding up to 100%), step time on the right.

    One bar per step, or per bin of consecutive steps when ``bars`` bins them (the mean over the
    bin of each step's share; the step time its median with p10–p90 whiskers). Always :data:`FIGURE_SIZE`.
    """
    import numpy as np

    from ..figures.phases import plt, save_figure

    if bars.is_empty():
        return []
    x = np.arange(bars.height)
    binned = bool((bars["n_steps"] > 1).any())
    fig, ax = plt.subplots(figsize=FIGURE_SIZE)
    fig.subplots_adjust(left=0.07, right=0.72, bottom=0.17, top=0.88)
    bottom = np.zeros(bars.height)
    data = share_figure_data(shares, bars)
    phases = data["phase"].unique(maintain_order=True).to_list()
    colors = _colors(phases)
    for phase in phases:
        rows = data.filter(pl.col("phase") == phase)
        height = np.zeros(bars.height)
        height[rows["bar"].to_numpy()] = rows["share_pct"].to_numpy()
        ax.bar(
            x,
            height,
            bottom=bottom,
            width=0.8,
            label=phase,
            color=colors[phase],
            hatch="//" if phase == OTHER else None,
            edgecolor="white",
            linewidth=0.3,
        )
        bottom += height
    ax.set_ylim(0, 100)
    ax.set_xlim(-0.6, bars.height - 0.4)
    ax.set_ylabel("share of step time (%)")
    _step_time_axis(ax, x, bars, binned)
    _x_labels(ax, x, bars["label"].to_list(), binned)
    n_steps = int(bars["n_steps"].sum())
    ax.set_title(
        f"Share of step time per phase (VeRL timers, {n_steps} steps)"
        + (
            "\nbars: mean share over consecutive steps; step time: median, p10–p90"
            if binned
            else ""
        ),
        fontsize=10,
    )
    handles, labels = ax.get_legend_handles_labels()
    step_handles, step_labels = fig.axes[-1].get_legend_handles_labels()
    ax.legend(
        handles[::-1] + step_handles,
        labels[::-1] + step_labels,
        loc="upper left",
        bbox_to_anchor=(1.1, 1.0),
        frameon=False,
        fontsize=8,
    )
    return save_figure(fig, out, "phase_share", data=data)


def share_figure_data(shares: pl.DataFrame, bars: pl.DataFrame) -> pl.DataFrame:
    """The numbers :func:`phase_share_figure` draws, one row per bar and phase.

    ``share_pct``: the segment's height (%); ``step_s``: the step time's dot (a bin's median);
    ``step_p10_s``, ``step_p90_s``: its whisker ends, drawn (and given) only for bins.
    """
    binned = bool((bars["n_steps"] > 1).any())
    whisker = [pl.col(c) if binned else pl.lit(None, pl.Float64) for c in ("p10_s", "p90_s")]
    steps = bars.select(
        "bar",
        "label",
        "n_steps",
        pl.col("median_s").alias("step_s"),
        whisker[0].alias("step_p10_s"),
        whisker[1].alias("step_p90_s"),
    )
    return (
        shares.with_columns(
            (100 * pl.col("share")).fill_nan(None).fill_null(0.0).alias("share_pct")
        )
        .join(steps, on="bar", how="left", maintain_order="left")
        .select(
            "bar", "label", "n_steps", "phase", "share_pct", "step_s", "step_p10_s", "step_p90_s"
        )
    )


def _step_time_axis(ax: plt.Axes, x: np.ndarray, bars: pl.DataFrame, binned: bool) -> None:
    """Step time (s) on a right axis: dots per step, or median with p10–p90 per bin."""
    import numpy as np

    right = ax.twinx()
    median = bars["median_s"].to_numpy()
    low = median - bars["p10_s"].to_numpy()
    high = bars["p90_s"].to_numpy() - median
    right.errorbar(
        x,
        median,
        yerr=np.vstack([low, high]) if binned else None,
        fmt="o-" if bars.height <= 40 else "-",
        color="#222222",
        markersize=3,
        linewidth=0.8,
        capsize=2 if binned else 0,
        label="step time (s)" + ("\nmedian, p10–p90" if binned else ""),
    )
    right.set_ylim(0, float(np.nanmax(bars["p90_s"].to_numpy())) * 1.15 or 1.0)
    right.set_ylabel("step time (s)")


def _x_labels(ax: plt.Axes, x: np.ndarray, labels: list[str], binned: bool) -> None:
    """At most 20 tick labels, slanted when they are step ranges."""
    every = max(1, -(-len(labels) // 20))
    ax.set_xticks(x[::every], labels[::every], rotation=45 if binned else 0, fontsize=7)
    ax.set_xlabel("steps (binned)" if binned else "step")
