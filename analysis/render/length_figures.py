"""Figures of response lengths and rollout stragglers (from finished tables)."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
from matplotlib.colors import LogNorm

from analysis.render.figures import plt, save_figure


def length_cdf(responses: pl.DataFrame, out: Path, *, max_steps: int = 5) -> list[Path]:
    """CDF of response length for a few steps (first, last and evenly between), overlaid."""
    steps = sorted(responses["step"].unique().to_list())
    if not steps:
        return []
    picks = sorted(
        {steps[int(i)] for i in np.linspace(0, len(steps) - 1, min(max_steps, len(steps)))}
    )
    fig, ax = plt.subplots(figsize=(6, 4))
    for step in picks:
        values = np.sort(responses.filter(pl.col("step") == step)["output_len"].to_numpy())
        ax.step(
            values, np.arange(1, len(values) + 1) / len(values), where="post", label=f"step {step}"
        )
    ax.set_xscale("log")
    ax.set_xlabel("response length (tokens)")
    ax.set_ylabel("fraction of responses ≤ length")
    ax.set_title("Response-length CDF")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "length_cdf")


def length_heatmap(responses: pl.DataFrame, out: Path, *, bins: int = 40) -> list[Path]:
    """Share of responses per length bin (log-spaced) and step."""
    if responses.is_empty():
        return []
    steps = sorted(responses["step"].unique().to_list())
    top = max(int(cast(int, responses["output_len"].max())), 2)
    edges = np.logspace(0, np.log10(top + 1), bins + 1)
    grid = np.zeros((bins, len(steps)))
    for j, step in enumerate(steps):
        counts, _ = np.histogram(
            responses.filter(pl.col("step") == step)["output_len"].to_numpy(), bins=edges
        )
        grid[:, j] = counts / max(counts.sum(), 1)
    fig, ax = plt.subplots(figsize=(max(6, 0.3 * len(steps) + 3), 4))
    # log colors: the rare very long responses (the stragglers) must stay visible
    grid = np.where(grid > 0, grid, np.nan)
    norm = LogNorm(vmin=max(np.nanmin(grid), 1e-4), vmax=np.nanmax(grid))
    mesh = ax.pcolormesh(
        np.arange(len(steps) + 1), edges, grid, cmap="viridis", shading="flat", norm=norm
    )
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(steps)) + 0.5, [str(s) for s in steps], fontsize=7)
    ax.set_xlabel("step")
    ax.set_ylabel("response length (tokens)")
    ax.set_title("Response-length distribution over steps")
    fig.colorbar(mesh, ax=ax, label="share of the step's responses")
    fig.tight_layout()
    return save_figure(fig, out, "length_heatmap")


def straggler_timeline(tails: pl.DataFrame, out: Path, *, max_steps: int = 4) -> list[Path]:
    """Per step and rank: generation (solid) and the idle wait for the slowest rank (hatched)."""
    if tails.is_empty():
        return []
    steps = sorted(tails["step"].unique().to_list())[:max_steps]
    fig, axes = plt.subplots(
        len(steps), 1, figsize=(9, 1.2 + 0.45 * tails["pid"].n_unique() * len(steps)), squeeze=False
    )
    for ax, step in zip(axes[:, 0], steps, strict=True):
        rows = tails.filter(pl.col("step") == step).sort("pid")
        origin = rows["gen_start_ns"].min()
        for i, row in enumerate(rows.iter_rows(named=True)):
            start = (row["gen_start_ns"] - origin) / 1e6
            busy = (row["gen_end_ns"] - row["gen_start_ns"]) / 1e6
            ax.barh(i, busy, left=start, color="#55A868")
            ax.barh(
                i,
                row["idle_tail_ns"] / 1e6,
                left=start + busy,
                color="white",
                edgecolor="#C44E52",
                hatch="///",
            )
        ax.set_yticks(range(rows.height), [f"pid {p}" for p in rows["pid"]], fontsize=8)
        ax.set_title(f"step {step}: generation per rank, idle tail hatched", fontsize=9)
    axes[-1, 0].set_xlabel("ms since the first rank started generating")
    fig.tight_layout()
    return save_figure(fig, out, "straggler_timeline")
