"""Figures of a run comparison (:func:`analysis.workload.compare.compare_runs`'s summary table)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analysis.aggregate.steps import STEP_METRICS
from analysis.model import WINDOW
from analysis.render.figures import plt, save_figure

#: most phases drawn per comparison figure (the largest by the metric); all go to the tables
MAX_FIGURE_PHASES = 30


def _largest_paths(rows: pl.DataFrame, paths: list[str], max_phases: int) -> list[str]:
    """Of ``paths`` (in their order), the ``max_phases`` with the largest median in any run."""
    largest = set(
        rows.group_by("path")
        .agg(pl.col("median").max())
        .sort("median", "path", descending=[True, False])
        .head(max_phases)["path"]
        .to_list()
    )
    return [p for p in paths if p in largest]


def _metric_figure(
    rows: pl.DataFrame, runs: list[str], paths: list[str], n_paths: int, title: tuple[str, str]
) -> plt.Figure:
    """Grouped bars of one metric: a bar per run and phase, p10–p90 whiskers."""
    label, unit = title
    width = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(paths) + 2), 4))
    for k, run in enumerate(runs):
        mine = {r["path"]: r for r in rows.filter(pl.col("run") == run).iter_rows(named=True)}
        medians = [mine[p]["median"] if p in mine else 0.0 for p in paths]
        low = [
            m - (mine[p]["p10"] if p in mine else m) for p, m in zip(paths, medians, strict=True)
        ]
        high = [
            (mine[p]["p90"] if p in mine else m) - m for p, m in zip(paths, medians, strict=True)
        ]
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(paths))]
        ax.bar(xs, medians, width, yerr=[low, high], capsize=2, label=run)
    ticks = [p if len(p) <= 40 else p[:39] + "…" for p in paths]  # long range names
    ax.set_xticks(range(len(paths)), ticks, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"{label} ({unit}), median over steps")
    shown = f" ({len(paths)} largest of {n_paths})" if n_paths > len(paths) else ""
    ax.set_title(f"{label} per phase{shown}")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def comparison_figures(
    summary: pl.DataFrame, out: Path, *, max_phases: int = MAX_FIGURE_PHASES
) -> list[Path]:
    """One grouped-bar figure per metric (median, p10–p90 whiskers) over the step phases.

    At most ``max_phases`` phases per figure: those with the largest median in any run.
    """
    written: list[Path] = []
    data = summary.filter(
        (pl.col("attribution") == WINDOW) | ~pl.col("path").str.starts_with("step")
    ).filter(pl.col("median").is_not_null())
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    for metric, title in STEP_METRICS.items():
        rows = data.filter(pl.col("metric") == metric)
        if rows.is_empty():
            continue
        paths = rows["path"].unique(maintain_order=True).to_list()
        n_paths = len(paths)
        if n_paths > max_phases:  # --all-ranges on a PyTorch capture: thousands of ranges
            paths = _largest_paths(rows, paths, max_phases)
            rows = rows.filter(pl.col("path").is_in(paths))
        fig = _metric_figure(rows, runs, paths, n_paths, title)
        written += save_figure(fig, out, f"compare_{metric}")
    return written
