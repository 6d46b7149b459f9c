"""Figures of response lengths and rollout stragglers (from finished tables).

Each on the phase figures' fixed canvas whatever the number of steps and ranks; the rollout's
``cap`` (max response length), when given, is drawn as a dashed line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.ticker import MaxNLocator

from analysis.normalize.devices import device_label
from analysis.render.figures import CANVAS, plt, save_figure

#: The straggler figure's canvas (inches): a heatmap and a panel over steps.
STRAGGLER_CANVAS = (8.0, 4.5)
#: Most x tick labels on a per-step axis.
MAX_STEP_TICKS = 12
#: Beyond this many steps, ``length_heatmap`` pools consecutive steps into this many columns.
MAX_HEATMAP_COLUMNS = 100
_CAP_STYLE: dict[str, Any] = {"color": "#C44E52", "linestyle": "--", "linewidth": 1.0}


def _step_ticks(ax: Axes, steps: list[int]) -> None:
    """Cell centres 0.5, 1.5, … labelled with their step, at most ``MAX_STEP_TICKS`` of them.

    Round step numbers (2, 4, … or 100, 200, …) where the steps hold them, else every k-th step.
    """
    where = {step: i for i, step in enumerate(steps)}
    nice = MaxNLocator(MAX_STEP_TICKS, integer=True, steps=[1, 2, 5, 10])
    ticks = np.asarray(nice.tick_values(steps[0], steps[-1])).astype(int)
    picks = [where[s] for s in ticks.tolist() if s in where]
    if len(steps) > 1 and len(picks) < 2:  # sparse, irregular step numbers
        picks = list(range(0, len(steps), -(-len(steps) // MAX_STEP_TICKS)))
    ax.set_xticks([i + 0.5 for i in picks], [str(steps[i]) for i in picks], fontsize=7)


def length_cdf(
    responses: pl.DataFrame, out: Path, *, cap: int | None = None, max_steps: int = 5
) -> list[Path]:
    """CDF of response length for a few steps (first, last and evenly between), overlaid."""
    steps = sorted(responses["step"].unique().to_list())
    if not steps:
        return []
    picks = sorted(
        {steps[int(i)] for i in np.linspace(0, len(steps) - 1, min(max_steps, len(steps)))}
    )
    fig, ax = plt.subplots(figsize=CANVAS)
    for step in picks:
        values = np.sort(responses.filter(pl.col("step") == step)["output_len"].to_numpy())
        ax.step(
            values, np.arange(1, len(values) + 1) / len(values), where="post", label=f"step {step}"
        )
    if cap is not None:
        ax.axvline(cap, label=f"cap {cap:,} tokens", **_CAP_STYLE)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("response length (tokens, log scale)")
    ax.set_ylabel("fraction of responses ≤ length")
    ax.set_title(f"Response-length CDF ({len(picks)} of {len(steps)} steps)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "length_cdf")


def length_heatmap(
    responses: pl.DataFrame, out: Path, *, cap: int | None = None, bins: int = 40
) -> list[Path]:
    """Share of responses per length bin (log-spaced, over the data's range) and step.

    Beyond ``MAX_HEATMAP_COLUMNS`` steps a column pools consecutive steps' responses.
    """
    if responses.is_empty():
        return []
    steps = sorted(responses["step"].unique().to_list())
    low = max(int(cast(int, responses["output_len"].min())), 1)
    high = max(int(cast(int, responses["output_len"].max())), low + 1)
    if cap is not None:
        high = max(high, cap)
    edges = np.logspace(np.log10(low), np.log10(high + 1), bins + 1)
    # steps[k] goes to column k * columns // len(steps): consecutive steps, near-equal sizes
    columns = min(MAX_HEATMAP_COLUMNS, len(steps))
    column_of = {step: k * columns // len(steps) for k, step in enumerate(steps)}
    per_column = responses.with_columns(
        pl.col("step").replace_strict(column_of, return_dtype=pl.Int64).alias("column")
    ).partition_by("column", as_dict=True)
    grid = np.zeros((bins, columns))
    for j in range(columns):
        counts, _ = np.histogram(per_column[(j,)]["output_len"].to_numpy(), bins=edges)
        grid[:, j] = counts / max(counts.sum(), 1)
    # column j spans step positions from its first step, ceil(j * len(steps) / columns)
    starts = [-(-j * len(steps) // columns) for j in range(columns)]
    fig, ax = plt.subplots(figsize=CANVAS)
    # log colors: the rare very long responses (the stragglers) must stay visible
    grid = np.where(grid > 0, grid, np.nan)
    norm = LogNorm(vmin=max(np.nanmin(grid), 1e-4), vmax=np.nanmax(grid))
    mesh = ax.pcolormesh(
        np.array([*starts, len(steps)]),
        edges,
        grid,
        cmap="viridis",
        shading="flat",
        norm=norm,
        rasterized=columns > 40,  # an SVG of 4,000 cells is heavy
    )
    if cap is not None:
        ax.axhline(cap, label=f"cap {cap:,} tokens", **_CAP_STYLE)
        ax.legend(loc="lower left", bbox_to_anchor=(1.18, 0.0), frameon=False, fontsize=8)
    ax.set_yscale("log")
    # room above the cap so its line does not sit on the frame
    ax.set_ylim(edges[0], edges[-1] * (1.25 if cap is not None else 1.0))
    ax.set_xlabel("step")
    ax.set_ylabel("response length (tokens, log scale)")
    pooled = columns < len(steps)
    ax.set_title(
        "Response-length distribution over steps"
        + (f" ({len(steps)} steps in {columns} columns)" if pooled else "")
    )
    _step_ticks(ax, steps)
    ax.set_xlim(0, len(steps))
    fig.colorbar(mesh, ax=ax, label=f"share of the {'column' if pooled else 'step'}'s responses")
    fig.tight_layout()
    return save_figure(fig, out, "length_heatmap")


def _rank_labels(tails: pl.DataFrame) -> pl.DataFrame:
    """``pid, label``: each rank by its GPU (``device_label``), the pid added where GPUs repeat."""
    ranks = tails.select("pid", *(["device"] if "device" in tails.columns else [])).unique()
    if "device" not in ranks.columns:
        ranks = ranks.with_columns(pl.lit(None, dtype=pl.String).alias("device"))
    ranks = ranks.sort("device", "pid", nulls_last=True)
    shared = ranks["device"].is_duplicated().to_list()
    labels = [
        f"pid {pid}"
        if device is None
        else device_label(device) + (f" · pid {pid}" if repeat else "")
        for pid, device, repeat in zip(ranks["pid"], ranks["device"], shared, strict=True)
    ]
    return ranks.with_columns(pl.Series("label", labels))


def straggler_timeline(tails: pl.DataFrame, out: Path) -> list[Path]:
    """All steps: each rank's idle tail (heatmap, rank/GPU × step) and the slowest vs median gen.

    The idle tail is the time a rank waits after its own generation for the step's slowest rank.
    """
    if tails.is_empty():
        return []
    ranks = _rank_labels(tails)
    steps = sorted(tails["step"].unique().to_list())
    cells = (
        tails.join(ranks.select("pid", "label"), on="pid")
        .with_columns(((pl.col("gen_end_ns") - pl.col("gen_start_ns")) / 1e6).alias("gen_ms"))
        .with_columns((pl.col("idle_tail_ns") / 1e6).alias("tail_ms"))
    )
    grid = np.full((ranks.height, len(steps)), np.nan)
    row = {label: i for i, label in enumerate(ranks["label"])}
    col = {step: j for j, step in enumerate(steps)}
    for label, step, tail in cells.select("label", "step", "tail_ms").iter_rows():
        grid[row[label], col[step]] = tail
    fig, (heat, gen) = plt.subplots(
        2, 1, figsize=STRAGGLER_CANVAS, sharex=True, height_ratios=(3, 2), layout="constrained"
    )
    mesh = heat.pcolormesh(
        np.arange(len(steps) + 1),
        np.arange(ranks.height + 1),
        grid,
        cmap="Reds",
        vmin=0,
        rasterized=len(steps) > 40,
    )
    # one colour bar beside both panels keeps their step axes aligned
    fig.colorbar(mesh, ax=[heat, gen], label="idle tail (ms)", shrink=0.6, anchor=(0.0, 1.0))
    heat.set_yticks(np.arange(ranks.height) + 0.5, ranks["label"].to_list(), fontsize=7)
    heat.invert_yaxis()
    heat.set_title("Idle tail per rank and step (white: the step's slowest rank)", fontsize=9)
    per_step = (
        cells.group_by("step")
        .agg(pl.col("gen_ms").max().alias("slowest"), pl.col("gen_ms").median().alias("median"))
        .sort("step")
    )
    x = np.arange(len(steps)) + 0.5
    marker = "o" if len(steps) <= 40 else None
    gen.plot(x, per_step["slowest"], color="#C44E52", marker=marker, ms=3, lw=1, label="slowest")
    gen.plot(x, per_step["median"], color="#55A868", marker=marker, ms=3, lw=1, label="median")
    gen.set_ylim(bottom=0)
    gen.set_ylabel("generation (ms)")
    gen.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, fontsize=8)
    _step_ticks(gen, steps)
    gen.set_xlim(0, len(steps))
    gen.set_xlabel("step")
    return save_figure(fig, out, "straggler_timeline")
