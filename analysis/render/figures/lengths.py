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

from ...normalize.devices import device_label
from .phases import CANVAS, plt, save_figure

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


def cdf_data(responses: pl.DataFrame, cap: int | None, max_steps: int = 5) -> pl.DataFrame:
    """What ``length_cdf`` draws: each shown step's responses, sorted, and the share at most as long.

    ``kind`` ``cdf``: ``step, length_tokens, fraction_at_most``; ``kind`` ``cap``: the cap line
    (``length_tokens``). Shown: the first, last and evenly between, at most ``max_steps`` steps.
    """
    steps = sorted(responses["step"].unique().to_list())
    picks = sorted(
        {steps[int(i)] for i in np.linspace(0, len(steps) - 1, min(max_steps, len(steps)))}
    )
    at_most = (pl.int_range(1, pl.len() + 1) / pl.len()).over("step")
    curves = (
        responses.filter(pl.col("step").is_in(picks))
        .select("step", pl.col("output_len").cast(pl.Int64).alias("length_tokens"))
        .sort("step", "length_tokens")
        .with_columns(at_most.alias("fraction_at_most"))
    )
    rows = [curves.select(pl.lit("cdf").alias("kind"), pl.all())]
    if cap is not None:
        rows.append(pl.DataFrame({"kind": ["cap"], "length_tokens": [cap]}))
    return pl.concat(rows, how="diagonal_relaxed")


def length_cdf(
    responses: pl.DataFrame, out: Path, *, cap: int | None = None, max_steps: int = 5
) -> list[Path]:
    """CDF of response length for a few steps (first, last and evenly between), overlaid.

    Data: :func:`cdf_data`.
    """
    n_steps = responses["step"].n_unique()
    if not n_steps:
        return []
    data = cdf_data(responses, cap, max_steps)
    curves = data.filter(pl.col("kind") == "cdf")
    fig, ax = plt.subplots(figsize=CANVAS)
    for (step,), rows in curves.partition_by("step", as_dict=True, maintain_order=True).items():
        x, y = rows["length_tokens"].to_numpy(), rows["fraction_at_most"].to_numpy()
        ax.step(x, y, where="post", label=f"step {step}")
    if cap is not None:
        ax.axvline(cap, label=f"cap {cap:,} tokens", **_CAP_STYLE)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("response length (tokens, log scale)")
    ax.set_ylabel("fraction of responses ≤ length")
    n_shown = curves["step"].n_unique()
    ax.set_title(f"Response-length CDF ({n_shown} of {n_steps} steps)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "length_cdf", data=data)


def heatmap_data(
    responses: pl.DataFrame, cap: int | None = None, bins: int = 40
) -> tuple[pl.DataFrame, np.ndarray]:
    """What ``length_heatmap`` draws, and the length bin edges (log-spaced over the data's range).

    ``kind`` ``cell``: per ``column`` (consecutive steps ``first_step``–``last_step``,
    ``n_responses``) and length ``bin`` (``length_low_tokens`` ≤ length < ``length_high_tokens``,
    the last bin closed) with responses, their ``share_of_responses`` in the column; ``kind``
    ``cap``: the cap line (``length_low_tokens``). Beyond ``MAX_HEATMAP_COLUMNS`` steps a
    column pools consecutive steps.
    """
    steps = sorted(responses["step"].unique().to_list())
    low = max(int(cast(int, responses["output_len"].min())), 1)
    high = max(int(cast(int, responses["output_len"].max())), low + 1)
    if cap is not None:
        high = max(high, cap)
    edges = np.logspace(np.log10(low), np.log10(high + 1), bins + 1)
    # steps[k] goes to column k * columns // len(steps): consecutive steps, near-equal sizes
    columns = min(MAX_HEATMAP_COLUMNS, len(steps))
    column_of = {step: k * columns // len(steps) for k, step in enumerate(steps)}
    spans = pl.DataFrame(
        {"bin": np.arange(bins), "length_low_tokens": edges[:-1], "length_high_tokens": edges[1:]}
    )
    parts = []
    for (j,), rows in (
        responses.with_columns(
            pl.col("step").replace_strict(column_of, return_dtype=pl.Int64).alias("column")
        )
        .partition_by("column", as_dict=True)
        .items()
    ):
        counts, _ = np.histogram(rows["output_len"].to_numpy(), bins=edges)
        parts.append(
            spans.with_columns(pl.Series("count", counts, pl.Int64)).with_columns(
                pl.lit(j).alias("column"),
                pl.lit(rows["step"].min()).alias("first_step"),
                pl.lit(rows["step"].max()).alias("last_step"),
                pl.lit(rows.height).alias("n_responses"),
            )
        )
    cells = (
        pl.concat(parts)
        .filter(pl.col("count") > 0)
        .select(
            pl.lit("cell").alias("kind"),
            pl.col("column").cast(pl.Int64),
            pl.col("first_step").cast(pl.Int64),
            pl.col("last_step").cast(pl.Int64),
            pl.col("n_responses").cast(pl.Int64),
            pl.col("bin").cast(pl.Int64),
            "length_low_tokens",
            "length_high_tokens",
            (pl.col("count") / pl.col("n_responses")).alias("share_of_responses"),
        )
        .sort("column", "bin")
    )
    if cap is not None:
        cap_row = pl.DataFrame({"kind": ["cap"], "length_low_tokens": [float(cap)]})
        cells = pl.concat([cells, cap_row], how="diagonal_relaxed")
    return cells, edges


def length_heatmap(
    responses: pl.DataFrame, out: Path, *, cap: int | None = None, bins: int = 40
) -> list[Path]:
    """Share of responses per length bin (log-spaced, over the data's range) and step.

    Beyond ``MAX_HEATMAP_COLUMNS`` steps a column pools consecutive steps. Data:
    :func:`heatmap_data`.
    """
    if responses.is_empty():
        return []
    data, edges = heatmap_data(responses, cap, bins)
    steps = sorted(responses["step"].unique().to_list())
    columns = min(MAX_HEATMAP_COLUMNS, len(steps))
    cells = data.filter(pl.col("kind") == "cell")
    grid = np.full((bins, columns), np.nan)  # no response: no colour
    grid[cells["bin"].to_numpy(), cells["column"].to_numpy()] = cells["share_of_responses"]
    # column j spans step positions from its first step, ceil(j * len(steps) / columns)
    starts = [-(-j * len(steps) // columns) for j in range(columns)]
    fig, ax = plt.subplots(figsize=CANVAS)
    # log colors: the rare very long responses (the stragglers) must stay visible
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
    return save_figure(fig, out, "length_heatmap", data=data)


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


def straggler_data(tails: pl.DataFrame) -> pl.DataFrame:
    """What ``straggler_timeline`` draws.

    ``kind`` ``idle_tail``: per ``step`` and rank (``pid``, ``device``, its label ``rank``) the
    ``idle_tail_ms``; ``kind`` ``generation``: per step ``gen_slowest_ms`` and ``gen_median_ms``
    over the ranks (a rank's generation: its ``gen_end_ns − gen_start_ns``).
    """
    ranks = _rank_labels(tails).rename({"label": "rank"})
    cells = tails.join(ranks.select("pid", "rank"), on="pid").with_columns(
        ((pl.col("gen_end_ns") - pl.col("gen_start_ns")) / 1e6).alias("gen_ms")
    )
    device = pl.col("device") if "device" in tails.columns else pl.lit(None, pl.String)
    heat = cells.select(
        pl.lit("idle_tail").alias("kind"),
        "step",
        "pid",
        device.alias("device"),
        "rank",
        (pl.col("idle_tail_ns") / 1e6).alias("idle_tail_ms"),
    )
    per_step = cells.group_by("step").agg(
        pl.lit("generation").alias("kind"),
        pl.col("gen_ms").max().alias("gen_slowest_ms"),
        pl.col("gen_ms").median().alias("gen_median_ms"),
    )
    return pl.concat([heat.sort("step", "pid"), per_step.sort("step")], how="diagonal_relaxed")


def straggler_timeline(tails: pl.DataFrame, out: Path) -> list[Path]:
    """All steps: each rank's idle tail (heatmap, rank/GPU × step) and the slowest vs median gen.

    The idle tail is the time a rank waits after its own generation for the step's slowest rank.
    Data: :func:`straggler_data`.
    """
    if tails.is_empty():
        return []
    data = straggler_data(tails)
    ranks = _rank_labels(tails)
    steps = sorted(tails["step"].unique().to_list())
    grid = np.full((ranks.height, len(steps)), np.nan)
    row = {label: i for i, label in enumerate(ranks["label"])}
    col = {step: j for j, step in enumerate(steps)}
    heat_rows = data.filter(pl.col("kind") == "idle_tail")
    for label, step, tail in heat_rows.select("rank", "step", "idle_tail_ms").iter_rows():
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
    per_step = data.filter(pl.col("kind") == "generation")
    x = np.array([col[step] for step in per_step["step"]]) + 0.5
    marker = "o" if len(steps) <= 40 else None
    slowest, median = per_step["gen_slowest_ms"], per_step["gen_median_ms"]
    gen.plot(x, slowest, color="#C44E52", marker=marker, ms=3, lw=1, label="slowest")
    gen.plot(x, median, color="#55A868", marker=marker, ms=3, lw=1, label="median")
    gen.set_ylim(bottom=0)
    gen.set_ylabel("generation (ms)")
    gen.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False, fontsize=8)
    _step_ticks(gen, steps)
    gen.set_xlim(0, len(steps))
    gen.set_xlabel("step")
    return save_figure(fig, out, "straggler_timeline", data=data)
