"""The per-step phase stack that ``phase_time_per_step`` draws: phases, ``other``, binned steps."""

from __future__ import annotations

import polars as pl


def step_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """The phases directly inside ``step`` (summed over processes), else top-level ranges."""
    inside = phases.filter(
        pl.col("path").str.starts_with("step/") & (pl.col("path").str.count_matches("/") == 1)
    )
    if inside.is_empty():
        inside = phases.filter((pl.col("level") == 0) & (pl.col("canonical") != "step"))
    return (
        inside.filter(pl.col("step").is_not_null())
        .group_by("step", "canonical")
        .agg(
            pl.col("wall_ns").sum(),
            pl.col("gpu_busy_ns").sum(),
            pl.col("idle_ns").sum(),
            pl.col("nccl_ns").sum(),
            pl.col("memcpy_ns").sum(),
            pl.col("memcpy_bytes").sum(),
            pl.col("energy_j").sum(),
            pl.col("energy_j").is_not_null().any().alias("has_energy"),
            pl.col("start_ns").min(),
        )
        .sort("step", "start_ns")
    )


MAX_STEP_BARS = 40
"""Beyond this many steps, ``phase_time_per_step`` draws binned steps (their mean), not one bar each."""
OTHER = "other (no phase)"


def step_stack(phases: pl.DataFrame, max_bars: int = MAX_STEP_BARS) -> pl.DataFrame:
    """Wall ms per (bar, phase) of the per-step stack, with an ``other (no phase)`` segment.

    ``other`` is the ``step`` range's wall time (the longest where several processes mark it)
    minus its phases', where that is positive, so a bar adds up to its step. Up to ``max_bars``
    steps, one bar per step; beyond, steps are cut into ``max_bars`` consecutive bins and each
    bar is the bin's mean per step (means add up as the steps do). Columns: ``bar`` (label),
    ``first_step``, ``canonical``, ``wall_ms``.
    """
    data = step_phases(phases)
    if data.is_empty():
        return pl.DataFrame(
            schema={
                "bar": pl.String,
                "first_step": pl.Int64,
                "canonical": pl.String,
                "wall_ms": pl.Float64,
            }
        )
    per_step = data.select("step", "canonical", pl.col("wall_ns").cast(pl.Float64))
    step_wall = (
        phases.filter((pl.col("path") == "step") & pl.col("step").is_not_null())
        .group_by("step")
        .agg(pl.col("wall_ns").max().cast(pl.Float64).alias("step_ns"))
    )
    other = (
        per_step.group_by("step")
        .agg(pl.col("wall_ns").sum().alias("phases_ns"))
        .join(step_wall, on="step", how="inner")
        .select(
            "step",
            pl.lit(OTHER).alias("canonical"),
            (pl.col("step_ns") - pl.col("phases_ns")).alias("wall_ns"),
        )
        .filter(pl.col("wall_ns") > 0)
    )
    per_step = pl.concat([per_step, other])
    steps = sorted(per_step["step"].unique().to_list())
    n_bins = min(max_bars, len(steps))
    # steps[k] goes to bin k * n_bins // len(steps): consecutive, sizes differing by at most one
    bins = pl.DataFrame(
        {"step": steps, "bin": [k * n_bins // len(steps) for k in range(len(steps))]},
        schema={"step": per_step.schema["step"], "bin": pl.Int64},
    )
    labels = (
        bins.group_by("bin")
        .agg(
            pl.col("step").min().alias("first_step"),
            pl.col("step").max().alias("last_step"),
            pl.len().alias("n"),
        )
        .with_columns(
            pl.when(pl.col("first_step") == pl.col("last_step"))
            .then(pl.col("first_step").cast(pl.String))
            .otherwise(pl.format("{}–{}", "first_step", "last_step"))
            .alias("bar")
        )
    )
    return (
        per_step.join(bins, on="step")
        .group_by("bin", "canonical")
        .agg(pl.col("wall_ns").sum())
        .join(labels, on="bin")
        .select(
            "bar",
            pl.col("first_step").cast(pl.Int64),
            "canonical",
            (pl.col("wall_ns") / pl.col("n") / 1e6).alias("wall_ms"),
        )
        .sort("first_step", "canonical")
    )
