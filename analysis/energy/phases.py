"""Energy per phase range, per device, transition energy, and energy conservation.

- ``energy_j``: energy of the devices concerned over the range's interval (window: every sampled
  GPU; projection: the GPUs its operations ran on).
- ``avg_power_w = energy_j / wall``; ``peak_power_w``: the highest single-GPU sample inside.
- ``energy_above_idle_j = energy_j − Σ idle_power_w × wall`` (idle baseline measured or given).
- ``energy_samples``: fewest samples inside the range on any of its devices;
  ``below_sampling_interval``: the range is shorter than the sampling interval (its energy is
  interpolated, not measured: read it as an estimate).
- ``gap_energy_j``: a range's energy outside its child ranges (transitions between phases),
  measured over those stretches of time, not as a difference; null for a range without children.
- Conservation (:func:`energy_balance`): three independent figures over the window timeline —
  the counters' total over the sampled span, the sum of every phase's energy outside its
  children, and the energy of the time no phase covers — must agree.

Energy is never negative. A device whose samples are not one sampler's series (two readings at
one instant, a counter that goes back: two samplers or two runs' files interleaved, or a counter
reset) gets null energy everywhere, with an error-level warning (:data:`ENERGY_ERROR`) that names
it and the phases whose energy came out negative; so does any other negative interval energy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from .balance import exclusive_intervals, piece_energy
from .idle import idle_baseline
from .samples import PowerData, cumulative_energy, interval_energy, sample_faults

ENERGY_COLUMNS = {
    "energy_j": pl.Float64,
    "avg_power_w": pl.Float64,
    "peak_power_w": pl.Float64,
    "energy_above_idle_j": pl.Float64,
    "gap_energy_j": pl.Float64,
    "energy_samples": pl.Int64,
    "below_sampling_interval": pl.Boolean,
}

#: Prefix of error-level warnings: an energy figure was wrong and has been left null.
ENERGY_ERROR = "ERROR: "


@dataclass
class PhaseEnergy:
    """:func:`phase_energy`'s result."""

    #: energy columns (:data:`ENERGY_COLUMNS`) per range ``rid``
    per_range: pl.DataFrame
    #: ``rid, device, energy_j, energy_above_idle_j, peak_power_w, energy_samples``
    per_device: pl.DataFrame
    #: ``device, idle_power_w``
    idle: pl.DataFrame
    #: error-level warnings (:data:`ENERGY_ERROR`): devices and phases left null
    warnings: list[str] = field(default_factory=list)


def range_devices(
    phases: pl.DataFrame,
    projection_devices: pl.DataFrame,
    devices: list[str],
    window_devices: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """(rid, device) pairs whose energy counts for each range.

    ``projection_devices``: (rid, device) for every device a projection range's operations ran on;
    ``window_devices``: (rid, device), each window range's pool's GPUs (None: every GPU).
    """
    window_rids = phases.filter(pl.col("attribution") == "window").select("rid")
    if window_devices is None:
        window = window_rids.join(
            pl.DataFrame({"device": devices}, schema={"device": pl.String}), how="cross"
        )
    else:
        window = window_rids.join(window_devices, on="rid").filter(pl.col("device").is_in(devices))
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
    window_devices: pl.DataFrame | None = None,
) -> PhaseEnergy:
    """Energy columns per range (``rid``), per (range, device), and the idle baseline per device.

    ``blocks``: busy stretches of the run's operations (:func:`analysis.energy.samples.busy_blocks`).
    A device with broken samples (:func:`sample_faults`) and any negative (range, device)
    energy are left null, each with an error-level warning; a range's energy is null when any
    of its devices' is.
    """
    cum = cumulative_energy(power)
    devices = sorted(cum["device"].unique().to_list())
    faults = sample_faults(cum)
    idle = (
        pl.DataFrame({"device": devices, "idle_power_w": [float(idle_power_w)] * len(devices)})
        if idle_power_w is not None
        else idle_baseline(cum, blocks, interval_ns=power.interval_ns)
    )
    pairs_rd = range_devices(phases, projection_devices, devices, window_devices)
    intervals = pairs_rd.join(phases.select("rid", "start_ns", "end_ns"), on="rid").rename(
        {"rid": "id"}
    )
    raw = interval_energy(cum, intervals).rename({"id": "rid"})
    warnings = _error_warnings(raw, phases, faults)
    untrusted = pl.col("device").is_in(list(faults)) | (pl.col("energy_j") < 0)
    per_device = (
        raw.with_columns(
            pl.when(untrusted).then(None).otherwise(pl.col(c)).alias(c)
            for c in ("energy_j", "peak_power_w")
        )
        .join(idle, on="device", how="left")
        .with_columns(
            (
                pl.col("energy_j")
                - pl.col("idle_power_w") * (pl.col("end_ns") - pl.col("start_ns")) / 1e9
            ).alias("energy_above_idle_j")
        )
    )
    per_range = _per_range(
        per_device, phases, _gap_energy(cum, phases, pairs_rd, faults), power.interval_ns
    )
    device_cols = per_device.select(
        "rid",
        "device",
        "energy_j",
        "energy_above_idle_j",
        "peak_power_w",
        pl.col("n_samples").alias("energy_samples"),
    )
    return PhaseEnergy(per_range, device_cols, idle, warnings)


def _per_range(
    per_device: pl.DataFrame, phases: pl.DataFrame, gaps: pl.DataFrame, interval: int | None
) -> pl.DataFrame:
    """The energy columns (:data:`ENERGY_COLUMNS`) per range from its devices' rows."""
    # float sums: a fixed order keeps results bit-identical from run to run
    summed = (
        per_device.sort("rid", "device")
        .group_by("rid", maintain_order=True)
        .agg(
            # null when any device's is: a partial sum would read as a real number
            _sum_if_complete("energy_j"),
            pl.col("peak_power_w").max(),
            _sum_if_complete("energy_above_idle_j"),
            pl.col("n_samples").min().alias("energy_samples"),
        )
    )
    wall_s = (pl.col("end_ns") - pl.col("start_ns")) / 1e9
    return (
        phases.select("rid", "start_ns", "end_ns")
        .join(summed, on="rid", how="left")
        .join(gaps, on="rid", how="left")
        .with_columns(
            (pl.col("energy_j") / wall_s).alias("avg_power_w"),
            (
                pl.lit(interval is not None)
                & ((pl.col("end_ns") - pl.col("start_ns")) < (interval or 0))
            ).alias("below_sampling_interval"),
        )
        .select("rid", *ENERGY_COLUMNS)
        .cast(ENERGY_COLUMNS)  # type: ignore[arg-type]
    )


def _sum_if_complete(name: str) -> pl.Expr:
    return pl.when(pl.col(name).null_count() == 0).then(pl.col(name).sum()).alias(name)


def _error_warnings(raw: pl.DataFrame, phases: pl.DataFrame, faults: dict[str, str]) -> list[str]:
    """One error-level warning per device with broken samples or a negative interval energy."""
    negative = (
        raw.filter(pl.col("energy_j") < 0)
        .join(phases.select("rid", "trace", "pid", "step", "path"), on="rid")
        .sort("device", "start_ns", "rid")
    )
    warnings = []
    for device in sorted(set(faults) | set(negative["device"].to_list())):
        rows = negative.filter(pl.col("device") == device)
        listed = "; ".join(
            f"{r['trace']} pid {r['pid']} step {r['step']} {r['path']} ({r['energy_j']:.3f} J)"
            for r in rows.head(3).iter_rows(named=True)
        )
        if rows.height > 3:
            listed += f"; and {rows.height - 3} more"
        negatives = (
            f"; {rows.height} phase range(s) came out negative: {listed}" if rows.height else ""
        )
        if device in faults:
            warnings.append(
                f"{ENERGY_ERROR}GPU {device}: power samples are not one series "
                f"({faults[device]}: two samplers' or two runs' samples interleaved, or a counter "
                f"reset); its energy is left null{negatives}"
            )
        else:
            warnings.append(f"{ENERGY_ERROR}GPU {device}: negative energy, left null{negatives}")
    return warnings


def _gap_energy(
    cum: pl.DataFrame, phases: pl.DataFrame, pairs_rd: pl.DataFrame, faults: dict[str, str]
) -> pl.DataFrame:
    """``gap_energy_j`` of every range with children, on that range's devices."""
    parents = phases.filter(pl.col("parent_rid").is_not_null()).select(
        pl.col("parent_rid").alias("rid")
    )
    with_children = parents.unique()
    pieces = (
        exclusive_intervals(phases.select("rid", "parent_rid", "start_ns", "end_ns"))
        .join(with_children, on="rid")
        .join(pairs_rd, on="rid")
    )
    energy = piece_energy(cum, pieces).with_columns(
        pl.when(pl.col("device").is_in(list(faults)) | (pl.col("energy_j") < 0))
        .then(None)
        .otherwise(pl.col("energy_j"))
        .alias("energy_j")
    )
    per_device = (
        pairs_rd.join(with_children, on="rid")
        .join(
            energy.sort("rid", "device", "start_ns")
            .group_by("rid", "device", maintain_order=True)
            .agg(pl.col("energy_j").sum(), pl.col("energy_j").null_count().alias("nulls")),
            on=["rid", "device"],
            how="left",
        )
        # no piece on a device: its children cover the range, 0 J outside them
        .with_columns(
            pl.when(pl.col("nulls") > 0)
            .then(None)
            .otherwise(pl.col("energy_j").fill_null(0.0))
            .alias("energy_j")
        )
    )
    return (
        per_device.sort("rid", "device")
        .group_by("rid", maintain_order=True)
        .agg(_sum_if_complete("energy_j").alias("gap_energy_j"))
    )
