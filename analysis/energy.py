"""Energy per phase range, per device, transition energy, and energy conservation.

- ``energy_j``: energy of the devices concerned over the range's interval (window: every sampled
  GPU; projection: the GPUs its operations ran on).
- ``avg_power_w = energy_j / wall``; ``peak_power_w``: the highest single-GPU sample inside.
- ``energy_above_idle_j = energy_j − Σ idle_power_w × wall`` (idle baseline measured or given).
- ``energy_samples``: fewest samples inside the range on any of its devices;
  ``below_sampling_interval``: the range is shorter than the sampling interval (its energy is
  interpolated, not measured: read it as an estimate).
- ``gap_energy_j``: a range's energy outside its child ranges (transitions between phases).
- Conservation: over the window timeline, every joule of the sampled span lands in one innermost
  phase or in ``unattributed_energy_j``.
"""

from __future__ import annotations

import polars as pl

from analysis.power import PowerData, cumulative_energy, energy_at, idle_baseline, interval_energy

ENERGY_COLUMNS = {
    "energy_j": pl.Float64,
    "avg_power_w": pl.Float64,
    "peak_power_w": pl.Float64,
    "energy_above_idle_j": pl.Float64,
    "gap_energy_j": pl.Float64,
    "energy_samples": pl.Int64,
    "below_sampling_interval": pl.Boolean,
}


def range_devices(
    phases: pl.DataFrame, projection_devices: pl.DataFrame, devices: list[str]
) -> pl.DataFrame:
    """(rid, device) pairs whose energy counts for each range.

    ``projection_devices``: (rid, device) for every device a projection range's operations ran on.
    """
    window = (
        phases.filter(pl.col("attribution") == "window")
        .select("rid")
        .join(pl.DataFrame({"device": devices}, schema={"device": pl.String}), how="cross")
    )
    projection_rids = phases.filter(pl.col("attribution") == "projection").select("rid")
    projection = (
        projection_devices.join(projection_rids, on="rid")
        .select("rid", "device")
        .unique()
        .filter(pl.col("device").is_in(devices))
    )
    return pl.concat([window, projection])


def phase_energy(
    phases: pl.DataFrame,
    projection_devices: pl.DataFrame,
    blocks: pl.DataFrame,
    power: PowerData,
    *,
    idle_power_w: float | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Energy columns per range (``rid``), per (range, device), and the idle baseline per device.

    ``blocks``: busy stretches of the run's operations (:func:`analysis.power.busy_blocks`).
    """
    cum = cumulative_energy(power)
    devices = sorted(cum["device"].unique().to_list())
    if idle_power_w is not None:
        idle = pl.DataFrame(
            {"device": devices, "idle_power_w": [float(idle_power_w)] * len(devices)}
        )
    else:
        idle = idle_baseline(cum, blocks, interval_ns=power.interval_ns)
    pairs_rd = range_devices(phases, projection_devices, devices)
    intervals = pairs_rd.join(phases.select("rid", "start_ns", "end_ns"), on="rid").rename(
        {"rid": "id"}
    )
    per_device = (
        interval_energy(cum, intervals)
        .rename({"id": "rid"})
        .join(idle, on="device", how="left")
        .with_columns(
            (
                pl.col("energy_j")
                - pl.col("idle_power_w") * (pl.col("end_ns") - pl.col("start_ns")) / 1e9
            ).alias("energy_above_idle_j")
        )
    )
    # float sums: a fixed order keeps results bit-identical from run to run
    per_range = (
        per_device.sort("rid", "device")
        .group_by("rid", maintain_order=True)
        .agg(
            pl.col("energy_j").sum(),
            pl.col("peak_power_w").max(),
            # null when any device lacks a baseline: a partial sum would read as a real number
            pl.when(pl.col("energy_above_idle_j").null_count() == 0)
            .then(pl.col("energy_above_idle_j").sum())
            .alias("energy_above_idle_j"),
            pl.col("n_samples").min().alias("energy_samples"),
        )
    )
    children = (
        phases.filter(pl.col("parent_rid").is_not_null())
        .select(pl.col("parent_rid").alias("rid"), pl.col("rid").alias("child"))
        .join(
            per_range.select(pl.col("rid").alias("child"), pl.col("energy_j").alias("child_j")),
            on="child",
        )
        .sort("rid", "child")
        .group_by("rid", maintain_order=True)
        .agg(pl.col("child_j").sum())
    )
    interval = power.interval_ns
    per_range = (
        phases.select("rid", "start_ns", "end_ns")
        .join(per_range, on="rid", how="left")
        .join(children, on="rid", how="left")
        .with_columns(
            (pl.col("energy_j") - pl.col("child_j")).alias("gap_energy_j"),
            (pl.col("energy_j") / ((pl.col("end_ns") - pl.col("start_ns")) / 1e9)).alias(
                "avg_power_w"
            ),
            (
                pl.lit(interval is not None)
                & ((pl.col("end_ns") - pl.col("start_ns")) < (interval or 0))
            ).alias("below_sampling_interval"),
        )
        .select("rid", *ENERGY_COLUMNS)
        .cast(ENERGY_COLUMNS)  # type: ignore[arg-type]
    )
    device_cols = per_device.select(
        "rid",
        "device",
        "energy_j",
        "energy_above_idle_j",
        "peak_power_w",
        pl.col("n_samples").alias("energy_samples"),
    )
    return per_range, device_cols, idle


def energy_conservation(
    power: PowerData, boundaries: pl.Series, innermost: pl.DataFrame
) -> dict[str, float]:
    """Total energy of the sampled span, split into innermost-phase and unattributed parts."""
    cum = cumulative_energy(power)
    total = float(
        cum.group_by("device")
        .agg(pl.col("cum_j").last() - pl.col("cum_j").first())
        .sort("device")
        .get_column("cum_j")
        .sum()
    )
    if boundaries.len() == 0:
        return {"total_energy_j": total, "attributed_energy_j": 0.0, "unattributed_energy_j": total}
    devices = cum["device"].unique().sort()
    grid = pl.DataFrame({"device": devices}).join(
        pl.DataFrame(
            {"boundary_index": pl.int_range(0, boundaries.len(), eager=True), "t_ns": boundaries}
        ),
        how="cross",
    )
    at = energy_at(cum, grid.select("device", "t_ns")).with_columns(grid["boundary_index"])
    # segment k (1 … n-1) lies between boundaries k-1 and k (see analysis.intervals.segments_of)
    segs = (
        at.sort("device", "boundary_index")
        .with_columns(
            (pl.col("cum_j") - pl.col("cum_j").shift(1).over("device")).alias("energy_j"),
            pl.col("boundary_index").alias("seg"),
        )
        .filter(pl.col("seg") > 0)
        .join(innermost, on="seg", how="left")
    )
    attributed = float(
        segs.filter(pl.col("rid").is_not_null()).sort("device", "seg")["energy_j"].sum()
    )
    return {
        "total_energy_j": total,
        "attributed_energy_j": attributed,
        "unattributed_energy_j": total - attributed,
    }
