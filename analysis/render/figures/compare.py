"""Figures of a run comparison (:func:`analysis.workload.compare.compare_runs`'s summary table).

One figure per metric on a fixed canvas (:data:`FIGSIZE` inches, PNG at
:data:`analysis.render.figures.phases.DPI` dpi and SVG), whatever the number of phases: horizontal
bars, one per run, phases top to bottom in execution order. The window scheme (the driver's
phases) and the projection scheme (the workers' ranges) get separate panels; ``step`` gets its
own panel and axis, so it does not dwarf its phases. Bars are medians over steps, whiskers p10–p90 over steps; the legend and
:func:`compare_caption` say so.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
from matplotlib.axes import Axes
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ...aggregate.steps import STEP_METRICS
from ...model import PROJECTION, WINDOW
from .captions import MAX_PANEL_PHASES
from .phases import plt, save_figure

#: most phases drawn per panel (the largest by the metric); all of them go to the tables
#: the canvas of every comparison figure (inches)
FIGSIZE = (7.5, 5.0)
#: one colour per run, in the runs' order (colour-blind-safe Okabe–Ito)
RUN_COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
#: longest phase label drawn (longer names are cut with …)
LABEL_CHARS = 30


def _largest(rows: pl.DataFrame, max_phases: int) -> tuple[list[str], int]:
    """The panel's phases in execution order, at most ``max_phases`` (the largest), and how many."""
    order = (
        rows.group_by("path")
        .agg(pl.col("phase_order").min(), pl.col("median").abs().max().alias("size"))
        .sort("phase_order", "path")
    )
    if order.height > max_phases:
        keep = set(order.sort(["size", "path"], descending=[True, False]).head(max_phases)["path"])
        return [p for p in order["path"] if p in keep], order.height
    return order["path"].to_list(), order.height


def _short(name: str) -> str:
    """``name`` in at most :data:`LABEL_CHARS` characters, keeping its end (the innermost phase)."""
    return name if len(name) <= LABEL_CHARS else "…" + name[-(LABEL_CHARS - 1) :]


def _bars(ax: Axes, rows: pl.DataFrame, runs: list[str], paths: list[str], spread: bool) -> None:
    """Grouped horizontal bars: a bar per run and phase (missing: none), p10–p90 whiskers."""
    height = 0.8 / len(runs)
    for k, run in enumerate(runs):
        mine = {r["path"]: r for r in rows.filter(pl.col("run") == run).iter_rows(named=True)}
        medians = [mine[p]["median"] if p in mine else math.nan for p in paths]
        low = [mine[p]["p10"] if p in mine else math.nan for p in paths]
        high = [mine[p]["p90"] if p in mine else math.nan for p in paths]
        ys = [i - 0.4 + height * (k + 0.5) for i in range(len(paths))]
        ax.barh(ys, medians, height, color=RUN_COLORS[k % len(RUN_COLORS)])
        if spread:
            err = [
                [max(m - lo, 0.0) for m, lo in zip(medians, low, strict=True)],
                [max(hi - m, 0.0) for m, hi in zip(medians, high, strict=True)],
            ]
            ax.errorbar(medians, ys, xerr=err, fmt="none", ecolor="#222", elinewidth=0.8, capsize=2)
    ax.set_yticks(range(len(paths)), [_short(p) for p in paths], fontsize=8)
    ax.set_ylim(len(paths) - 0.5, -0.5)  # execution order, top to bottom
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#ddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _panels(data: pl.DataFrame, max_phases: int) -> list[tuple[str, pl.DataFrame, list[str], int]]:
    """(title, rows, phases, phases in all) per panel: step, window phases, projection."""
    window = data.filter(pl.col("attribution") == WINDOW)
    panels = []
    for title, rows in (
        ("whole step (window)", window.filter(pl.col("path") == "step")),
        ("driver's phases (window)", window.filter(pl.col("path") != "step")),
        ("workers' ranges (projection)", data.filter(pl.col("attribution") == PROJECTION)),
    ):
        if rows.height:
            paths, n_all = _largest(rows, max_phases)
            panels.append((title, rows.filter(pl.col("path").is_in(paths)), paths, n_all))
    return panels


#: a metric's unit as a column-name suffix
_UNIT_SUFFIX = {"%": "pct", "ms": "ms", "MB": "mb", "J": "j", "W": "w"}


def metric_figure_data(
    rows: pl.DataFrame, metric: str, whole_capture: bool, max_phases: int = MAX_PANEL_PHASES
) -> pl.DataFrame:
    """What ``compare_<metric>`` draws: per panel, phase (``path``) and run the bar and whiskers.

    Columns ``panel, attribution, path, run, median_<unit>, p10_<unit>, p90_<unit>`` (whiskers
    null for a whole capture, where none is drawn); panels as drawn, phases top to bottom.
    """
    unit = _UNIT_SUFFIX.get(STEP_METRICS[metric][1], STEP_METRICS[metric][1].lower())
    parts = []
    for k, (title, data, paths, _) in enumerate(_panels(rows, max_phases)):
        order = pl.DataFrame({"path": paths, "position": range(len(paths))})
        panel = [pl.lit(title).alias("panel"), pl.lit(k).alias("k")]
        parts.append(data.join(order, on="path").with_columns(*panel))
    drawn = pl.concat(parts).sort("k", "position", "run_order")
    spread = [pl.col(q) if not whole_capture else pl.lit(None, pl.Float64) for q in ("p10", "p90")]
    return drawn.select(
        "panel",
        "attribution",
        "path",
        "run",
        pl.col("median").alias(f"median_{unit}"),
        spread[0].alias(f"p10_{unit}"),
        spread[1].alias(f"p90_{unit}"),
    )


def _metric_figure(
    rows: pl.DataFrame, runs: list[str], metric: str, whole_capture: bool, max_phases: int
) -> plt.Figure:
    """The figure of one metric: step, window and projection panels on :data:`FIGSIZE`."""
    label, unit = STEP_METRICS[metric]
    panels = _panels(rows, max_phases)
    left = [p for p in panels if "window" in p[0]]
    right = [p for p in panels if "projection" in p[0]]
    columns = [c for c in (left, right) if c]
    # constrained layout: the canvas stays FIGSIZE, the axes shrink to fit their labels
    fig = plt.figure(figsize=FIGSIZE, layout="constrained")
    grid = fig.add_gridspec(1, len(columns))
    for col, column in enumerate(columns):
        sizes = [len(paths) + 1.2 for _, _, paths, _ in column]
        sub = grid[0, col].subgridspec(len(column), 1, height_ratios=sizes)
        for i, (title, data, paths, n_all) in enumerate(column):
            ax = fig.add_subplot(sub[i, 0])
            _bars(ax, data, runs, paths, spread=not whole_capture)
            more = f" — {len(paths)} largest of {n_all}" if n_all > len(paths) else ""
            ax.set_title(title + more, fontsize=9, loc="left")
            ax.set_xlabel(f"{label} ({unit})", fontsize=8)
            if unit == "%":
                ax.set_xlim(0, 100)
    handles: list[Patch | Line2D] = [
        Patch(color=RUN_COLORS[k % len(RUN_COLORS)], label=run) for k, run in enumerate(runs)
    ]
    if not whole_capture:
        handles.append(
            Line2D([], [], color="#222", marker="|", linewidth=0.8, label="p10–p90 over steps")
        )
    fig.legend(
        handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=8
    )
    what = "value over the whole capture" if whole_capture else "median over steps"
    fig.suptitle(f"{label} per phase ({unit}): {what}", fontsize=11)
    return fig


def comparison_figures(
    summary: pl.DataFrame, out: Path, *, max_phases: int = MAX_PANEL_PHASES
) -> list[Path]:
    """One figure per metric with data (``compare_<metric>``.png/.svg/.csv under ``out``).

    At most ``max_phases`` phases per panel: those with the largest median in any run.
    """
    written: list[Path] = []
    data = summary.filter(pl.col("median").is_not_null())
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    whole_capture = summary["n_steps"].null_count() == summary.height
    for metric in STEP_METRICS:
        rows = data.filter(pl.col("metric") == metric)
        if rows.is_empty():
            continue
        fig = _metric_figure(rows, runs, metric, whole_capture, max_phases)
        drawn = metric_figure_data(rows, metric, whole_capture, max_phases)
        written += save_figure(fig, out, f"compare_{metric}", data=drawn)
    return written
