"""Share of a step per phase: the one definition every output uses (figures, report, terminal, API).

- time share of a phase in a step = the phase's wall time / the ``step`` range's wall time;
- energy share = the phase's energy / the ``step`` range's energy, which includes the energy
  drawn between phases (so shares need not add up to 100%: the rest is "other (no phase)").

The phases are those directly inside ``step`` (summed over processes, as in
:func:`~analysis.aggregate.step_stack.step_phases`); a step's wall time is its ``step`` range's
(the longest where several processes mark one). Without ``step`` ranges there is no step to
share: the frames are empty. Summaries over steps are the median and p10–p90 ("median over
steps"), computed per phase over the steps where the phase ran.
"""

from __future__ import annotations

import polars as pl

from analysis.aggregate.step_stack import step_phases

#: the quantiles of :func:`share_over_steps`: p10, median, p90
SHARE_QUANTILES = (0.1, 0.5, 0.9)

_SCHEMA = {
    "step": pl.Int64,
    "canonical": pl.String,
    "start_ns": pl.Int64,
    "wall_ns": pl.Int64,
    "step_wall_ns": pl.Int64,
    "time_share_pct": pl.Float64,
    "energy_j": pl.Float64,
    "step_energy_j": pl.Float64,
    "energy_share_pct": pl.Float64,
}


def step_walls(phases: pl.DataFrame) -> pl.DataFrame:
    """``step, step_wall_ns, step_energy_j``: each step's ``step`` range (longest over processes).

    ``step_energy_j`` is the energy of that longest range (null without power samples).
    """
    rows = phases.filter((pl.col("path") == "step") & pl.col("step").is_not_null())
    if "attribution" in rows.columns:
        # the step range is one range; under both schemes its wall and energy are the same
        rows = rows.sort("attribution").unique(["trace", "pid", "step"], keep="first")
    return (
        rows.sort(["step", "wall_ns", "trace", "pid"], descending=[False, True, False, False])
        .group_by("step", maintain_order=True)
        .agg(
            pl.col("wall_ns").first().alias("step_wall_ns"),
            pl.col("energy_j").first().cast(pl.Float64).alias("step_energy_j"),
        )
        .sort("step")
    )


def step_shares(phases: pl.DataFrame) -> pl.DataFrame:
    """Per (step, phase directly inside ``step``): wall and energy, and their share of the step.

    Columns: ``step, canonical, start_ns, wall_ns, step_wall_ns, time_share_pct, energy_j,
    step_energy_j, energy_share_pct`` (energy columns null without power samples; a share is
    null where its denominator is null or zero).
    """
    per_phase = step_phases(phases)
    walls = step_walls(phases)
    if per_phase.is_empty() or walls.is_empty():
        return pl.DataFrame(schema=_SCHEMA)
    joined = per_phase.join(walls, on="step", how="inner").with_columns(
        pl.when(pl.col("has_energy")).then(pl.col("energy_j")).cast(pl.Float64).alias("energy_j")
    )
    return joined.select(
        pl.col("step").cast(pl.Int64),
        "canonical",
        pl.col("start_ns").cast(pl.Int64),
        pl.col("wall_ns").cast(pl.Int64),
        pl.col("step_wall_ns").cast(pl.Int64),
        _ratio_pct("wall_ns", "step_wall_ns").alias("time_share_pct"),
        "energy_j",
        "step_energy_j",
        _ratio_pct("energy_j", "step_energy_j").alias("energy_share_pct"),
    ).sort("step", "start_ns", "canonical")


def share_over_steps(shares: pl.DataFrame) -> pl.DataFrame:
    """Per phase (execution order): ``n_steps`` and the p10/median/p90 of each share over steps.

    Columns: ``canonical, n_steps, time_share_p10, time_share_median, time_share_p90,
    energy_share_p10, energy_share_median, energy_share_p90`` (linear interpolation, as
    ``numpy.percentile``'s default).
    """
    names = {0.1: "p10", 0.5: "median", 0.9: "p90"}
    aggs = [
        pl.col(f"{what}_share_pct").quantile(q, "linear").alias(f"{what}_share_{names[q]}")
        for what in ("time", "energy")
        for q in SHARE_QUANTILES
    ]
    return (
        shares.group_by("canonical")
        .agg(pl.len().cast(pl.Int64).alias("n_steps"), *aggs, pl.col("start_ns").min())
        .sort("start_ns", "canonical")
        .drop("start_ns")
    )


def _ratio_pct(numerator: str, denominator: str) -> pl.Expr:
    den = pl.col(denominator).cast(pl.Float64)
    return pl.when(den > 0).then(pl.col(numerator).cast(pl.Float64) / den * 100)
