"""A step's phases and their share of it: the one definition every output uses.

- time share of a phase in a step = the phase's wall time / the ``step`` range's wall time;
- energy share = the phase's energy / the ``step`` range's energy, which includes the energy
  drawn between phases (so shares need not add up to 100%: the rest is "other (no phase)").

The phases of a step are the ranges directly inside a ``step`` range (path ``step/X``; a
range's path is built on its own thread, so the process running it marks that step). Where
several ``step`` ranges carry one index (several processes or threads mark the step, or a
process marks it twice), each quantity is the mean per ``step`` range: the phase's wall and
energy summed over those ranges' phases, the step's over the ranges, both divided by their
number; a share is then the sum over the sum. Each range is one row of the phase table,
under the one scheme its thread gives it, so nothing counts twice across ``projection`` and
``window`` rows. Without any ``step/X`` range, the top-level ranges of a step (assigned by
payload or time window) are its phases, each the mean over the processes running it.

Without ``step`` ranges there is no step to share: :func:`step_shares` is empty. Summaries
over steps are the median and p10–p90 ("median over steps"), per phase over the steps where
the phase ran.

A step with a range cut at the capture's end (:func:`cut_steps`: its ``step`` range, or one of
its phases, ends exactly there because nsys closed it when the capture stopped) has no true
wall time: it is left out of every share and of the per-step stack.
"""

from __future__ import annotations

import polars as pl

from ..model import CUT
from ..phase_paths import is_step_phase

#: the quantiles of :func:`share_over_steps`: p10, median, p90
SHARE_QUANTILES = (0.1, 0.5, 0.9)

_SCHEMA = {
    "step": pl.Int64,
    "canonical": pl.String,
    "start_ns": pl.Int64,
    "wall_ns": pl.Float64,
    "step_wall_ns": pl.Float64,
    "time_share_pct": pl.Float64,
    "energy_j": pl.Float64,
    "step_energy_j": pl.Float64,
    "energy_share_pct": pl.Float64,
    "n_step_ranges": pl.Int64,
}


def inside_step(phases: pl.DataFrame) -> pl.DataFrame:
    """The rows of a step's phases: ``step/X`` rows, else top-level non-``step`` rows (with a step)."""
    inside = phases.filter(is_step_phase())
    if inside.is_empty():
        inside = phases.filter((pl.col("level") == 0) & (pl.col("canonical") != "step"))
    return inside.filter(pl.col("step").is_not_null())


def is_cut(frame: pl.DataFrame) -> pl.Expr:
    """Whether a row of ``frame`` is cut at the capture's end (:data:`~analysis.model.CUT`).

    False throughout for a table without the column (an analysis of an earlier version).
    """
    return pl.col(CUT).fill_null(False) if CUT in frame.columns else pl.lit(False)


def cut_steps(phases: pl.DataFrame) -> list[int]:
    """The steps without a true wall time, sorted.

    A ``step`` range of theirs, or a range of one of their phases (:func:`inside_step`), ends
    exactly at the capture's end (:data:`~analysis.model.CUT`).
    """
    if CUT not in phases.columns:
        return []
    marks = phases.filter((pl.col("path") == "step") & is_cut(phases))["step"]
    inside = inside_step(phases)
    found = set(marks.drop_nulls().to_list()) | set(inside.filter(is_cut(inside))["step"])
    return sorted(found)


def without_cut_steps(phases: pl.DataFrame) -> pl.DataFrame:
    """``phases`` without the rows of :func:`cut_steps` (rows without a step are kept)."""
    cut = cut_steps(phases)
    if not cut:
        return phases
    chosen = pl.Series(cut, dtype=phases.schema["step"]).implode()
    return phases.filter(~pl.col("step").is_in(chosen).fill_null(False))


def _n_ranges(frame: pl.DataFrame) -> pl.Expr:
    """Ranges a row stands for (``n_ranges``; 1 per row in frames without that column)."""
    return pl.col("n_ranges") if "n_ranges" in frame.columns else pl.lit(1, dtype=pl.Int64)


def _sum_all(name: str) -> pl.Expr:
    """The sum of ``name``, null when any value is null (a partial sum is not the quantity)."""
    return pl.when(pl.col(name).is_null().any()).then(None).otherwise(pl.col(name).sum())


def step_walls(phases: pl.DataFrame) -> pl.DataFrame:
    """``step, n_step_ranges, step_wall_ns, step_energy_j`` per step with ``step`` ranges.

    The mean over the step's ``step`` ranges (one for a VeRL driver); ``step_energy_j`` null
    without power samples (or where one range lacks them). :func:`cut_steps` are left out.
    """
    phases = without_cut_steps(phases)
    rows = phases.filter((pl.col("path") == "step") & pl.col("step").is_not_null())
    n = pl.col("n_step_ranges")
    return (
        rows.group_by("step")
        .agg(
            _n_ranges(rows).sum().cast(pl.Int64).alias("n_step_ranges"),
            pl.col("wall_ns").sum().cast(pl.Float64).alias("step_wall_ns"),
            _sum_all("energy_j").cast(pl.Float64).alias("step_energy_j"),
        )
        .with_columns((pl.col("step_wall_ns") / n), (pl.col("step_energy_j") / n))
        .sort("step")
    )


def step_phase_walls(phases: pl.DataFrame) -> pl.DataFrame:
    """Per (step, phase): ``start_ns`` (first), ``wall_ns`` and ``energy_j`` of the mean step.

    With the step's columns of :func:`step_walls` (null for a step without ``step`` ranges,
    whose phases are then means over the processes running them). Sorted by step, start.
    :func:`cut_steps` are left out.
    """
    phases = without_cut_steps(phases)
    rows = inside_step(phases)
    walls = step_walls(phases)
    nested = rows["path"].str.starts_with("step/").any()
    keys = [c for c in ("trace", "pid") if c in rows.columns]
    per_process = pl.struct(keys).n_unique() if keys and not nested else pl.lit(1)
    summed = rows.group_by("step", "canonical").agg(
        pl.col("start_ns").min(),
        pl.col("wall_ns").sum().cast(pl.Float64),
        _sum_all("energy_j").cast(pl.Float64).alias("energy_j"),
        per_process.cast(pl.Int64).alias("n_processes"),
    )
    joined = summed.join(walls, on="step", how="left")
    # nested phases: per step range (the step's own count); else per process running it
    divisor = pl.col("n_step_ranges").fill_null(1) if nested else pl.col("n_processes")
    return (
        joined.with_columns(pl.col("wall_ns") / divisor, pl.col("energy_j") / divisor)
        .drop("n_processes")
        .sort("step", "start_ns", "canonical")
    )


def step_shares(phases: pl.DataFrame) -> pl.DataFrame:
    """Per (step, phase of the step): wall and energy, and their share of the step.

    Columns: ``step, canonical, start_ns, wall_ns, step_wall_ns, time_share_pct, energy_j,
    step_energy_j, energy_share_pct, n_step_ranges`` (walls in ns, means per ``step`` range as
    the module says; energy columns null without power samples; a share is null where its
    numerator or denominator is null, or the denominator zero). Steps without a ``step``
    range are left out, and so are :func:`cut_steps` (no true wall time).
    """
    per_phase = step_phase_walls(phases).filter(pl.col("n_step_ranges").is_not_null())
    if per_phase.is_empty():
        return pl.DataFrame(schema=_SCHEMA)
    return per_phase.select(
        pl.col("step").cast(pl.Int64),
        "canonical",
        pl.col("start_ns").cast(pl.Int64),
        "wall_ns",
        "step_wall_ns",
        _ratio_pct("wall_ns", "step_wall_ns").alias("time_share_pct"),
        "energy_j",
        "step_energy_j",
        _ratio_pct("energy_j", "step_energy_j").alias("energy_share_pct"),
        "n_step_ranges",
    ).sort("step", "start_ns", "canonical")


def share_over_steps(shares: pl.DataFrame) -> pl.DataFrame:
    """Per phase (execution order): ``n_steps`` and the p10/median/p90 of each share over steps.

    Columns: ``canonical, n_steps, time_share_p10, time_share_median, time_share_p90,
    energy_share_p10, energy_share_median, energy_share_p90`` (in %; linear interpolation, as
    ``numpy.percentile``'s default; over the steps where the phase ran, a null share left
    out). ``n_steps``: the steps where the phase ran.
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
