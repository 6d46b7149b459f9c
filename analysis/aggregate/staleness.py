"""Staleness of the samples each trainer step trained on, from the trainer's samples marks.

In asynchronous RL a trainer step at parameter version ``V`` trains on samples generated with
older versions ``v``; the lag ``V − v`` is the staleness VeRL's fully async trainer bounds
(``staleness_threshold``). The capture side marks, per step, how many samples each version
generated (:func:`nvtx_phases.pools.mark_samples`, read here by
:data:`nvtx_phases.naming.SAMPLES_MARK_PATTERN`); a step's staleness is over its samples.
"""

from __future__ import annotations

import polars as pl

from nvtx_phases.naming import DOMAIN, SAMPLES_MARK_PATTERN

STALENESS_SCHEMA = {
    "step": pl.Int64,
    "version": pl.Int64,
    "n_samples": pl.Int64,
    "min_lag": pl.Int64,
    "mean_lag": pl.Float64,
    "max_lag": pl.Int64,
    "stale_share": pl.Float64,
    "sample_versions": pl.String,
}


def staleness_table(marks: pl.DataFrame) -> pl.DataFrame | None:
    """One row per trainer step with a samples mark (:data:`STALENESS_SCHEMA`); None: no mark.

    ``stale_share``: the share of the step's samples with lag ≥ 1; ``sample_versions`` as
    marked (``version:count`` pairs). A step marked twice keeps its last mark.
    """
    found = (
        marks.filter(pl.col("domain").is_in([DOMAIN, ""]))
        .select(
            "ts_ns",
            pl.col("text").str.extract_groups(SAMPLES_MARK_PATTERN).alias("g"),
        )
        .unnest("g")
        .rename({"1": "step", "2": "version", "3": "sample_versions"})
        .filter(pl.col("step").is_not_null())
        .with_columns(pl.col("step", "version").cast(pl.Int64))
        .sort("step", "ts_ns")
        .unique("step", keep="last", maintain_order=True)
    )
    if found.is_empty():
        return None
    pairs = (
        found.select(
            "step",
            "version",
            pl.col("sample_versions").str.split(",").alias("pair"),
        )
        .explode("pair")
        .filter(pl.col("pair").is_not_null() & (pl.col("pair") != ""))
        .with_columns(
            pl.col("pair").str.split_exact(":", 1).struct.rename_fields(["v", "n"]).alias("p")
        )
        .unnest("p")
        .with_columns(pl.col("v", "n").cast(pl.Int64))
        .with_columns((pl.col("version") - pl.col("v")).alias("lag"))
    )
    n = pl.col("n").sum()
    counted = pl.when(n > 0)  # a step marked with no samples has no staleness, not 0
    per_step = pairs.group_by("step").agg(
        n.alias("n_samples"),
        pl.col("lag").filter(pl.col("n") > 0).min().alias("min_lag"),
        counted.then((pl.col("lag") * pl.col("n")).sum() / n).alias("mean_lag"),
        pl.col("lag").filter(pl.col("n") > 0).max().alias("max_lag"),
        counted.then(pl.col("n").filter(pl.col("lag") >= 1).sum() / n).alias("stale_share"),
    )
    return (
        found.select("step", "version", "sample_versions")
        .join(per_step, on="step", how="left")
        .with_columns(pl.col("n_samples").fill_null(0))
        .sort("step")
        .select(list(STALENESS_SCHEMA))
        .cast(STALENESS_SCHEMA)  # type: ignore[arg-type]
    )
