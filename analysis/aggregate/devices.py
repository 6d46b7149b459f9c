"""Window phases per GPU: where each rank's GPU was busy or idle while a driver phase was open."""

from __future__ import annotations

import polars as pl

from ..model import WINDOW
from .phases import SUMMED_METRICS, sum_or_null


def phase_devices(
    phases: pl.DataFrame,
    per_device: pl.DataFrame,
    run_devices: list[str],
    on_gpus: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Window phases per device: where each rank's GPU was busy or idle during a driver phase.

    ``on_gpus`` (a run with GPU pools): ``rid, device``, the GPUs of each window range's pool;
    the rows then carry ``pool``. None: every window range on every GPU of the run.
    """
    keys = ["trace", "pid", "step", "path", "phase"]
    pooled = on_gpus is not None and "pool" in phases.columns
    window = phases.filter(pl.col("attribution") == WINDOW).select(
        "rid",
        *[k for k in keys if k != "phase"],
        pl.col("name").alias("phase"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"),
        *(["pool"] if pooled else []),
    )
    if on_gpus is not None and pooled:
        grid = window.join(on_gpus, on="rid").join(per_device, on=["rid", "device"], how="left")
        keys = [*keys, "pool"]
    else:
        devices = pl.concat(
            [
                pl.DataFrame({"device": run_devices}, schema={"device": pl.String}),
                per_device.select("device"),
            ]
        ).unique()
        grid = window.join(devices, how="cross").join(per_device, on=["rid", "device"], how="left")
    filled = grid.with_columns(
        [pl.col(m).fill_null(0) for m in (*SUMMED_METRICS, "gpu_busy_ns")]
    ).with_columns((pl.col("wall_ns") - pl.col("gpu_busy_ns")).alias("idle_ns"))
    energy_aggs = (
        [
            sum_or_null("energy_j"),
            sum_or_null("energy_above_idle_j"),
            pl.col("peak_power_w").max(),
            pl.col("energy_samples").min(),
        ]
        if "energy_j" in filled.columns
        else []
    )
    return (
        filled.sort(*keys, "device", "rid", nulls_last=True)
        .group_by(*keys, "device")
        .agg(
            pl.col("wall_ns").sum(),
            pl.col("gpu_busy_ns").sum(),
            pl.col("idle_ns").sum(),
            *(pl.col(m).sum() for m in SUMMED_METRICS),
            *energy_aggs,
        )
        # every key: rows of several traces share (step, path, device)
        .sort(["step", "path", "device", "trace", "pid", "phase"], nulls_last=True)
        .select(
            *[c for c in keys if c != "pool"],
            "device",
            *(["pool"] if pooled else []),
            pl.exclude(*keys, "device"),
        )
    )
