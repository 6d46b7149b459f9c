"""The report's sections of an asynchronous run: its GPU pools, idle by cause, staleness."""

from __future__ import annotations

import polars as pl

from ...attribute.idle_causes import idle_totals
from ...model import Analysis
from .units import Section


def pool_sections(analysis: Analysis) -> list[Section]:
    """Pools (GPUs, processes, GPU time balance), idle GPU time by cause, staleness per step.

    Nothing for a run without pools; the staleness section wherever samples marks exist.
    """
    sections: list[Section] = []
    if analysis.pools is not None:
        sections.append(
            (
                "GPU pools",
                analysis.pools.select(
                    "pool",
                    "source",
                    pl.col("n_devices").alias("GPUs"),
                    "devices",
                    "processes",
                    "captured",
                    pl.col("total_gpu_ns").alias("gpu_time_ns"),
                    pl.col("attributed_gpu_ns").alias("in_phases_ns"),
                    pl.col("unattributed_gpu_ns").alias("outside_phases_ns"),
                ),
            )
        )
    if analysis.idle_causes is not None and not analysis.idle_causes.is_empty():
        sections.append(("Idle GPU time by cause, per pool", idle_totals(analysis.idle_causes)))
    if analysis.staleness is not None and not analysis.staleness.is_empty():
        sections.append(
            (
                "Staleness of the samples each trainer step trained on",
                analysis.staleness.select(
                    "step",
                    "version",
                    "n_samples",
                    "min_lag",
                    "mean_lag",
                    "max_lag",
                    (pl.col("stale_share") * 100).alias("stale_samples_pct"),
                ),
            )
        )
    return sections
