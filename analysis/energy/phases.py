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

from collections.abc import Iterator
from dataclasses import dataclass, field

import polars as pl

from analysis.energy.samples import (
    PowerData,
    cumulative_energy,
    energy_at,
    idle_baseline,
    interval_energy,
)

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

#: Relative tolerance of the conservation check. Every part is a difference of one cumulative
#: curve per device, linearly interpolated at the phases' ends; interpolation moves energy
#: between neighbouring parts but never loses or adds any (the parts telescope), so in exact
#: arithmetic they sum to the total. What remains is float rounding, a few ulps of the counter
#: value per interpolated end: below 1e-9 of the total even at a million phase ends. 1e-6
#: leaves a margin of 1000 and is still far below a single phase counted twice.
BALANCE_RTOL = 1e-6
#: Absolute floor of the tolerance (J), for runs that drew (almost) nothing.
BALANCE_ATOL_J = 1e-9


@dataclass
class PhaseEnergy:
    """:func:`phase_energy`'s result; unpacks as ``(per_range, per_device, idle)``."""

    #: energy columns (:data:`ENERGY_COLUMNS`) per range ``rid``
    per_range: pl.DataFrame
    #: ``rid, device, energy_j, energy_above_idle_j, peak_power_w, energy_samples``
    per_device: pl.DataFrame
    #: ``device, idle_power_w``
    idle: pl.DataFrame
    #: error-level warnings (:data:`ENERGY_ERROR`): devices and phases left null
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[pl.DataFrame]:
        """The three frames, as callers written before ``warnings`` unpack them."""
        return iter((self.per_range, self.per_device, self.idle))


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


def sample_faults(cum: pl.DataFrame) -> dict[str, str]:
    """Devices whose samples are not one series, with what is wrong (:func:`cumulative_energy`).

    A series has one reading per instant and a cumulative energy that never goes back. Two
    samplers' samples of one GPU interleaved (two runs' sampler files share a host, pid and
    NVML index), a counter reset or negative power break that, and with it every interval
    energy of the device. Readings at one instant are compared among themselves, not ordered,
    so the counts do not depend on how ties sort.
    """
    conflicts = (
        cum.group_by("device", "t_ns")
        .agg(
            ((pl.col("cum_j").n_unique() > 1) | (pl.col("power_w").n_unique() > 1)).alias("c"),
        )
        .group_by("device")
        .agg(pl.col("c").sum().alias("conflicts"))
    )
    drops = (
        cum.sort("device", "t_ns", "cum_j")
        .group_by("device", maintain_order=True)
        .agg((pl.col("cum_j").diff() < 0).sum().alias("drops"))
    )
    faults = {}
    for device, n_conflicts, n_drops in (
        conflicts.join(drops, on="device").sort("device").iter_rows()
    ):
        reasons = []
        if n_conflicts:
            reasons.append(f"{n_conflicts} instants with conflicting readings")
        if n_drops:
            reasons.append(f"its cumulative energy falls {n_drops} time(s)")
        if reasons:
            faults[device] = "; ".join(reasons)
    return faults


def phase_energy(
    phases: pl.DataFrame,
    projection_devices: pl.DataFrame,
    blocks: pl.DataFrame,
    power: PowerData,
    *,
    idle_power_w: float | None = None,
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
    # float sums: a fixed order keeps results bit-identical from run to run
    per_range = (
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
    gaps = _gap_energy(cum, phases, pairs_rd, faults)
    interval = power.interval_ns
    per_range = (
        phases.select("rid", "start_ns", "end_ns")
        .join(per_range, on="rid", how="left")
        .join(gaps, on="rid", how="left")
        .with_columns(
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
    return PhaseEnergy(per_range, device_cols, idle, warnings)


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


def exclusive_intervals(ranges: pl.DataFrame) -> pl.DataFrame:
    """Each range's time outside its child ranges: ``rid, start_ns, end_ns`` (several per rid).

    ``ranges``: ``rid, parent_rid, start_ns, end_ns``; a child counts only where it lies inside
    its parent, and only children among ``ranges`` count. A range without children is one
    piece, its whole interval; a range its children cover entirely has none.
    """
    parents = ranges.select("rid", pl.col("start_ns").alias("p0"), pl.col("end_ns").alias("p1"))
    children = (
        ranges.filter(pl.col("parent_rid").is_not_null())
        .select(pl.col("parent_rid").alias("rid"), "start_ns", "end_ns")
        .join(parents, on="rid")
        .with_columns(
            pl.max_horizontal("start_ns", "p0").alias("start_ns"),
            pl.min_horizontal("end_ns", "p1").alias("end_ns"),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("rid", "start_ns", "end_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("rid").alias("reach"))
    )
    before_each = children.select(
        "rid", pl.coalesce("reach", "p0").alias("start_ns"), pl.col("start_ns").alias("end_ns")
    )
    after_last = children.group_by("rid").agg(
        pl.col("end_ns").max().alias("start_ns"), pl.col("p1").first().alias("end_ns")
    )
    childless = ranges.join(children.select("rid").unique(), on="rid", how="anti").select(
        "rid", "start_ns", "end_ns"
    )
    schema = {"rid": ranges.schema["rid"], "start_ns": pl.Int64, "end_ns": pl.Int64}
    return (
        pl.concat([f.cast(schema) for f in (before_each, after_last, childless)])  # type: ignore[arg-type]
        .filter(pl.col("end_ns") > pl.col("start_ns"))
        .sort("rid", "start_ns")
    )


def _piece_energy(cum: pl.DataFrame, pieces: pl.DataFrame) -> pl.DataFrame:
    """``energy_j`` of each (``device``, ``start_ns``, ``end_ns``) row, from the counter curve."""
    if pieces.is_empty():
        return pieces.with_columns(pl.lit(None, dtype=pl.Float64).alias("energy_j"))
    at_start = energy_at(cum, pieces.select("device", pl.col("start_ns").alias("t_ns")))
    at_end = energy_at(cum, pieces.select("device", pl.col("end_ns").alias("t_ns")))
    return pieces.with_columns((at_end["cum_j"] - at_start["cum_j"]).alias("energy_j"))


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
    energy = _piece_energy(cum, pieces).with_columns(
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


def energy_balance(power: PowerData, timeline: pl.DataFrame) -> tuple[dict, list[str]]:
    """Total, attributed and unattributed energy, measured independently, and their check.

    ``timeline``: the window timeline's ranges (``rid, parent_rid, start_ns, end_ns``: the
    driver's window ranges, or every phase when there are none), on every sampled GPU:

    - ``total_energy_j``: the counters over the whole sampled span (last − first reading);
    - ``attributed_energy_j``: Σ over the timeline's ranges of their energy outside their
      children (a window phase's ``gap_energy_j``, or ``energy_j`` when it has no children);
    - ``unattributed_energy_j``: the energy of the stretches no range covers;
    - ``energy_conserved``: total = attributed + unattributed within :data:`BALANCE_RTOL`
      (``energy_balance_j`` = attributed + unattributed − total). Ranges that overlap without
      nesting (several driver threads or files, e.g. two runs forced together) count the
      shared time twice; that is what the check catches, with a warning.

    All null (None) when a device's samples are broken (:func:`sample_faults`;
    :func:`phase_energy` says which).
    """
    cum = cumulative_energy(power)
    if sample_faults(cum) or cum.is_empty():
        return dict.fromkeys(_BALANCE_KEYS), []
    devices = pl.DataFrame({"device": sorted(cum["device"].unique().to_list())})
    total = float(
        cum.group_by("device")
        .agg(pl.col("cum_j").last() - pl.col("cum_j").first())
        .sort("device")["cum_j"]
        .sum()
    )
    ranges = timeline.select("rid", "parent_rid", "start_ns", "end_ns")
    own = exclusive_intervals(ranges).join(devices, how="cross")
    attributed = _sorted_sum(_piece_energy(cum, own))
    span = (int(cum["t_ns"].min()), int(cum["t_ns"].max()))
    uncovered = _uncovered(ranges, *span).join(devices, how="cross")
    unattributed = _sorted_sum(_piece_energy(cum, uncovered))
    balance = attributed + unattributed - total
    tolerance = BALANCE_RTOL * max(abs(total), abs(attributed + unattributed)) + BALANCE_ATOL_J
    conserved = abs(balance) <= tolerance
    warnings = []
    if not conserved:
        why = (
            "phase ranges overlap without nesting (driver ranges of several threads or files, "
            "e.g. files of different runs), so their shared time is counted twice"
            if balance > 0
            else "please report this trace"
        )
        warnings.append(
            f"energy not conserved: {attributed:.3f} J in phases + {unattributed:.3f} J outside "
            f"them = {attributed + unattributed:.3f} J, but the counters measured {total:.3f} J "
            f"({balance:+.3f} J): {why}"
        )
    summary = {
        "total_energy_j": total,
        "attributed_energy_j": attributed,
        "unattributed_energy_j": unattributed,
        "energy_conserved": conserved,
        "energy_balance_j": balance,
    }
    return summary, warnings


_BALANCE_KEYS = (
    "total_energy_j",
    "attributed_energy_j",
    "unattributed_energy_j",
    "energy_conserved",
    "energy_balance_j",
)


def _sorted_sum(frame: pl.DataFrame) -> float:
    """Σ ``energy_j`` in a fixed order (bit-identical from run to run)."""
    if frame.is_empty():
        return 0.0
    return float(frame.sort("device", "start_ns", "end_ns")["energy_j"].sum())


def _uncovered(ranges: pl.DataFrame, lo: int, hi: int) -> pl.DataFrame:
    """Stretches of ``[lo, hi]`` that no range covers: ``start_ns, end_ns``."""
    ordered = ranges.select("start_ns", "end_ns").sort("start_ns", "end_ns")
    gaps = ordered.with_columns(
        pl.col("end_ns").cum_max().shift(1).fill_null(lo).alias("reach")
    ).select(pl.col("reach").alias("start_ns"), pl.col("start_ns").alias("end_ns"))
    reach = int(ordered["end_ns"].max()) if ordered.height else lo
    tail = pl.DataFrame({"start_ns": [reach], "end_ns": [hi]})
    return (
        pl.concat([gaps.cast(pl.Int64), tail.cast(pl.Int64)])
        .with_columns(
            pl.col("start_ns").clip(lo, hi),
            pl.col("end_ns").clip(lo, hi),
        )
        .filter(pl.col("end_ns") > pl.col("start_ns"))
    )
