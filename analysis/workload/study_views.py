"""The numbers the study's figures draw, from its tidy table: shares, scaling, lengths."""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl


def _depth1(tidy: pl.DataFrame) -> pl.DataFrame:
    """The step's direct phases (``step/X``, window scheme first where a run has both)."""
    return tidy.filter(pl.col("path").str.count_matches("/") == 1)


def phase_shares(tidy: pl.DataFrame, quantity: str) -> pl.DataFrame:
    """``run, path, attribution, share_pct`` of the step's direct phases (``time``/``energy``).

    The tidy table's ``time_share_pct``/``energy_share_pct``: the median over steps of each
    step's share (:mod:`analysis.aggregate.shares`, the report's and figures' one definition).
    """
    return _depth1(tidy.filter(pl.col("metric") == f"{quantity}_share_pct")).select(
        "run", "path", "attribution", pl.col("value").alias("share_pct")
    )


def run_samples(tidy: pl.DataFrame) -> dict[str, float]:
    """Each run's samples per step (the tidy table's ``samples_per_step`` on its ``step`` row)."""
    rows = tidy.filter(
        (pl.col("metric") == "samples_per_step")
        & (pl.col("path") == "step")
        & pl.col("value").is_not_null()
    )
    return dict(rows.group_by("run").agg(pl.col("value").first()).rows())


def parallel_efficiency(
    tidy: pl.DataFrame, group: str = "hardware", samples: Mapping[str, float] | None = None
) -> pl.DataFrame:
    """Per ``group`` value, phase and GPU count: scaling against the fewest GPUs.

    A run's cost is its GPU time per sample ``T · n / S`` (T: the phase's median wall time over
    steps, n: the ``n_gpus`` axis, S: its samples per step, from ``samples`` or else the tidy
    table's ``samples_per_step``: :func:`run_samples`); a point's cost is
    the median over its runs with an S. ``efficiency = cost(base) / cost(n)``, base the fewest
    GPUs of the group: 1 = the GPUs added did proportionally more work, batch grown or not.
    Where a point of a group has no run with an S, the group's ``basis`` is
    ``fixed_batch_assumed``: S equal across its runs, ``T(base) · n_base / (T(n) · n)``. Runs
    without a positive numeric ``n_gpus`` are left out. Columns: ``group, path, attribution,
    n_gpus, n_runs, wall_ms, samples_per_step, gpu_ms_per_sample, basis, n_base, efficiency``.
    """
    if "n_gpus" not in tidy.columns:
        return pl.DataFrame()
    keys = [group] if group in tidy.columns else []
    over = [*keys, "path", "attribution"]
    known = dict(samples if samples is not None else run_samples(tidy))
    runs = (
        tidy.filter((pl.col("metric") == "wall_ms") & pl.col("n_gpus").is_not_null())
        .with_columns(pl.col("n_gpus").cast(pl.Float64, strict=False).alias("n_gpus"))
        .filter(pl.col("n_gpus") > 0)
        .with_columns(
            pl.col("run")
            .replace_strict(known, default=None, return_dtype=pl.Float64)
            .alias("samples_per_step")
        )
    )
    per_run = pl.col("value") * pl.col("n_gpus")
    points = (
        runs.group_by(*over, "n_gpus")
        .agg(
            pl.len().cast(pl.Int64).alias("n_runs"),
            pl.col("value").median().alias("wall_ms"),
            pl.col("samples_per_step").median(),
            (per_run / pl.col("samples_per_step")).median().alias("per_sample"),
            per_run.median().alias("assumed"),
        )
        .with_columns(
            pl.when(pl.col("per_sample").is_not_null().all().over(over))
            .then(pl.lit("per_sample"))
            .otherwise(pl.lit("fixed_batch_assumed"))
            .alias("basis")
        )
        .with_columns(
            pl.when(pl.col("basis") == "per_sample")
            .then(pl.col("per_sample"))
            .otherwise(pl.col("assumed"))
            .alias("cost")
        )
        .sort(*over, "n_gpus")
    )
    base = points.group_by(over, maintain_order=True).agg(
        pl.col("n_gpus").first().alias("n_base"), pl.col("cost").first().alias("cost_base")
    )
    return (
        points.join(base, on=over, how="left")
        .with_columns(
            pl.when(pl.col("basis") == "per_sample")
            .then(pl.col("cost"))
            .alias("gpu_ms_per_sample"),
            pl.when(pl.col("cost") > 0)
            .then(pl.col("cost_base") / pl.col("cost"))
            .alias("efficiency"),
        )
        .select(
            *over,
            "n_gpus",
            "n_runs",
            "wall_ms",
            "samples_per_step",
            "gpu_ms_per_sample",
            "basis",
            "n_base",
            "efficiency",
        )
        .sort(*over, "n_gpus")
    )


def length_summary(responses: Mapping[str, pl.DataFrame]) -> pl.DataFrame:
    """Per run: median over steps of responses per step, max/mean length and DP-rank imbalance.

    ``max_over_mean`` and ``rank_imbalance`` (tokens per DP rank, max/mean) are
    :func:`analysis.workload.lengths.length_stats` and :func:`~analysis.workload.lengths.
    rank_imbalance` per step, then the median over steps. Validation rollouts are left out.
    """
    from .lengths import length_stats, rank_imbalance

    rows = []
    for label, frame in responses.items():
        stats = length_stats(frame)
        imbalance = rank_imbalance(frame)
        rows.append(
            {
                "run": label,
                "n_steps": stats.height,
                "responses_per_step": stats["n_responses"].cast(pl.Float64).median(),
                "mean_len": stats["mean"].median(),
                "max_over_mean": stats["max_over_mean"].median(),
                "rank_imbalance": imbalance["tokens_max_over_mean"].median(),
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "run": pl.String,
            "n_steps": pl.Int64,
            "responses_per_step": pl.Float64,
            "mean_len": pl.Float64,
            "max_over_mean": pl.Float64,
            "rank_imbalance": pl.Float64,
        },
    )


def energy_per_sample(tidy: pl.DataFrame, group: str = "hardware") -> pl.DataFrame:
    """Per ``group`` value and GPU count: the step's energy per sample, median over the runs.

    The tidy table's ``energy_per_sample_j`` on the ``step`` row (each run's median over steps
    of the step's energy / its sequences). Columns: ``group, n_gpus, n_runs,
    energy_per_sample_j``; runs without a positive numeric ``n_gpus`` or a value left out.
    """
    if "n_gpus" not in tidy.columns:
        return pl.DataFrame()
    keys = [group] if group in tidy.columns else []
    return (
        tidy.filter(
            (pl.col("metric") == "energy_per_sample_j")
            & (pl.col("path") == "step")
            & pl.col("value").is_not_null()
        )
        .with_columns(pl.col("n_gpus").cast(pl.Float64, strict=False))
        .filter(pl.col("n_gpus") > 0)
        .group_by(*keys, "n_gpus")
        .agg(
            pl.len().cast(pl.Int64).alias("n_runs"),
            pl.col("value").median().alias("energy_per_sample_j"),
        )
        .sort(*keys, "n_gpus")
    )


def token_energy(tidy: pl.DataFrame) -> pl.DataFrame:
    """``run, path, mj_per_token`` of the step and its direct phases (``j_per_token`` × 1000)."""
    return tidy.filter(
        (pl.col("metric") == "j_per_token")
        & (pl.col("path").str.count_matches("/") <= 1)
        & pl.col("value").is_not_null()
    ).select("run", "path", (pl.col("value") * 1000).alias("mj_per_token"))
