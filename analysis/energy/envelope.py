"""Power envelope per phase, for sizing power: percentiles, energy share and ramps (compute only).

Per window phase path (all steps together) and GPU, and per node (host): p50 / p95 / max power,
the share of the run's energy, and the ramp rate at the phase's start.

*Power series.* Each GPU's power is a step function: readings at instants ``t_0 < … < t_n``, the
power over ``(t_{k-1}, t_k]`` known at ``t_k``.

- ``energy_counter`` (every sample has ``energy_mj``): power = ΔE/Δt between counter updates,
  exact on average over each update period. When the sampler reads faster than the counter
  updates (an H200: reads every 25 ms, updates every 100 ms), an update happened between the
  last read before it and the first read showing it; the update instants are fitted as a
  regular clock (least squares on those brackets' midpoints, counting updates from one to the
  next) and used when ≥ 90% of them fall within their bracket ± 10% of the period, else the
  first reads showing each update (Δt then jitters by up to a read interval).
- ``power_w`` (no counter): each reading stands for the time since the previous one (NVML's
  reading is a trailing ~1 s average on recent GPUs: edges late, peaks flattened).

*Percentiles* are time-weighted over the phase's ranges: p95 is the power the GPU stays at or
below for 95% of the phase's time; max is the highest reading lying at least half inside the
ranges (a reading straddling a boundary mostly belongs to the neighbour), else the highest
reading overlapping them (a phase shorter than a reading). A phase row with
several ranges of its path in one step (``n_ranges`` > 1 in the phase table) counts over its
span ``start_ns``…``end_ns``. ``n_samples``: readings inside the ranges; ``few_samples`` when
fewer than 2 per range (the figures then blend neighbouring phases' power).

*Node*: the sum of the host's GPUs' step functions, on the union of their reading instants
(between two of them every GPU's power is constant, so the sum is exact), over the time all of
them have readings. GPUs whose host is unknown get no node row.

*Ramp*: ``(mean power over [s, s+w) − mean over [s−w, s)) / w`` in W/ms at each range's start
``s``, ``w`` = :data:`RAMP_READINGS` reading intervals (capped at the range's wall time); per
path the median over ranges and the steepest (signed). *Energy share*: the phase table's
``energy_j`` (per GPU) over the run's ``total_energy_j``, in %; nested paths overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..intervals import merged_instants
from ..model import WINDOW, Analysis
from .samples import PowerData, cumulative_energy, sample_faults

COUNTER = "energy_counter"
READING = "power_w"
#: Readings per ramp window: the ramp compares the mean power over this many reading intervals
#: after a phase starts with the mean over as many before it.
RAMP_READINGS = 3
#: The regular-clock fit of counter updates is used when this share of updates ...
FIT_MIN_INSIDE = 0.9
#: ... falls within its bracket widened by this fraction of the period on each side.
FIT_SLACK = 0.1

ENVELOPE_SCHEMA: dict[str, type[pl.DataType]] = {
    "scope": pl.String,
    "path": pl.String,
    "host": pl.String,
    "device": pl.String,
    "n_gpus": pl.Int64,
    "n_ranges": pl.Int64,
    "n_samples": pl.Int64,
    "few_samples": pl.Boolean,
    "power_from": pl.String,
    "p50_w": pl.Float64,
    "p95_w": pl.Float64,
    "max_w": pl.Float64,
    "energy_j": pl.Float64,
    "energy_share_pct": pl.Float64,
    "ramp_w_per_ms": pl.Float64,
    "ramp_max_w_per_ms": pl.Float64,
    "ramp_window_ms": pl.Float64,
}


@dataclass(frozen=True)
class Series:
    """A power step function: ``power[k]`` W over ``(t[k], t[k+1]]`` (``len(t) == len(power)+1``)."""

    t: np.ndarray  # int64 ns, increasing
    power: np.ndarray  # float64 W
    source: str  # COUNTER, READING, or "mixed" (a node of GPUs of both kinds)

    @property
    def interval_ns(self) -> float:
        """The median time between readings."""
        return float(np.median(np.diff(self.t)))


# --- power series ---------------------------------------------------------------------------------


def update_instants(t: np.ndarray, changed: np.ndarray) -> np.ndarray | None:
    """Fitted instants of the counter updates first seen at reads ``changed`` (indexes into ``t``).

    Update ``j`` happened in ``(t[changed[j]-1], t[changed[j]]]``. The updates are numbered from
    one to the next (the rounded ratio of read gaps to their median), then ``instant = a + n·T``
    is fitted to the brackets' midpoints. None when fewer than 3 updates or when under
    :data:`FIT_MIN_INSIDE` of the fitted instants land within their bracket ± :data:`FIT_SLACK`·T.
    """
    if len(changed) < 3:
        return None
    lo, hi = t[changed - 1], t[changed]
    gaps = np.diff(hi)
    steps = np.rint(gaps / np.median(gaps))
    if np.any(steps < 1):
        return None
    n = np.concatenate([[0.0], np.cumsum(steps)])
    mid = (lo - hi[0]) / 2 + (hi - hi[0]) / 2  # relative to hi[0]: small, exact-ish floats
    period, offset = np.polyfit(n, mid, 1)
    fitted = offset + n * period
    slack = FIT_SLACK * period
    inside = (fitted > lo - hi[0] - slack) & (fitted <= hi - hi[0] + slack)
    if period <= 0 or inside.mean() < FIT_MIN_INSIDE:
        return None
    return hi[0] + np.rint(fitted).astype(np.int64)


def _counter_series(t: np.ndarray, energy_mj: np.ndarray) -> Series | None:
    """Power from the energy counter (ΔE/Δt between updates; see the module docstring)."""
    changed = np.flatnonzero(np.diff(energy_mj) != 0) + 1
    if len(changed) == 0:
        return None
    slower = (
        np.median(np.diff(t[changed])) > 1.5 * np.median(np.diff(t)) if len(changed) > 1 else False
    )
    instants = update_instants(t, changed) if slower else None
    if instants is not None:
        at, energy = instants, energy_mj[changed]
    else:  # the counter is current at each read (or the fit failed): reads showing a change
        reads = np.concatenate([[0], changed])
        at, energy = t[reads], energy_mj[reads]
    if len(at) < 2 or np.any(np.diff(at) <= 0):
        return None
    power = np.diff(energy).astype(np.float64) * 1e6 / np.diff(at)  # mJ/ns → W
    return Series(at, power, COUNTER)


def device_series(samples: pl.DataFrame) -> dict[str, Series]:
    """Each GPU's power series (``samples``: ``device, t_ns, power_w, energy_mj``).

    GPUs whose samples are not one series (:func:`~analysis.energy.samples.sample_faults`: two
    readings at one instant, a counter that goes back; their energy is null too) get none.
    """
    has_counter = samples["energy_mj"].null_count() == 0
    faults = sample_faults(
        cumulative_energy(PowerData(samples, "nvml-counter" if has_counter else "nvml-power", None))
    )
    series: dict[str, Series] = {}
    for (device,), rows in samples.sort("t_ns").group_by("device", maintain_order=True):
        if device in faults or rows.height < 2:
            continue
        t = rows["t_ns"].to_numpy()
        one: Series | None
        if rows["energy_mj"].null_count() == 0:
            one = _counter_series(t, rows["energy_mj"].to_numpy())
        else:
            power = rows["power_w"].to_numpy()
            one = Series(t, power[1:].astype(np.float64), READING)
        if one is not None:
            series[str(device)] = one
    return series


def node_series(gpus: list[Series]) -> Series | None:
    """The sum of ``gpus``' power on the union of their instants, where all have readings."""
    start = max(int(s.t[0]) for s in gpus)
    end = min(int(s.t[-1]) for s in gpus)
    if end <= start:
        return None
    t = merged_instants([s.t[(s.t >= start) & (s.t <= end)] for s in gpus] + [[start, end]])
    total = np.zeros(len(t) - 1)
    for s in gpus:  # the GPU segment (t_k, t_k+1] holding each node segment: first with t_k+1 ≥ end
        total += s.power[np.searchsorted(s.t[1:], t[1:], side="left")]
    sources = {s.source for s in gpus}
    return Series(t, total, sources.pop() if len(sources) == 1 else "mixed")


# --- per phase ------------------------------------------------------------------------------------


def _overlaps(
    s: Series, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(range index, segment index, overlap ns) of every segment overlapping every range."""
    seg_start, seg_end = s.t[:-1], s.t[1:]
    lo = np.searchsorted(seg_end, starts, side="right")
    hi = np.searchsorted(seg_start, ends, side="left")
    counts = np.maximum(hi - lo, 0)
    rng = np.repeat(np.arange(len(starts)), counts)
    seg = (
        np.arange(counts.sum())
        - np.repeat(np.cumsum(counts) - counts, counts)
        + np.repeat(lo, counts)
    )
    overlap = np.minimum(seg_end[seg], ends[rng]) - np.maximum(seg_start[seg], starts[rng])
    return rng, seg, overlap


def _ramps(s: Series, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Ramp (W/ms) at each range's start; NaN where a window leaves the series."""
    cum = np.concatenate([[0.0], np.cumsum(s.power * np.diff(s.t) / 1e9)])  # J at each instant
    w = np.minimum(RAMP_READINGS * s.interval_ns, (ends - starts).astype(np.float64))
    starts_f = starts.astype(np.float64)
    t = s.t.astype(np.float64)
    before, at, after = (np.interp(starts_f + k * w, t, cum) for k in (-1, 0, 1))
    with np.errstate(divide="ignore", invalid="ignore"):  # w = 0: a zero-length range, masked
        ramp = ((after - at) - (at - before)) / (w / 1e9) / (w / 1e6)
    valid = (starts_f - w >= t[0]) & (starts_f + w <= t[-1]) & (w > 0)
    return np.where(valid, ramp, np.nan)


def unit_stats(s: Series, ranges: pl.DataFrame) -> pl.DataFrame:
    """Per path of ``ranges`` (``path, start_ns, end_ns``): the envelope of series ``s``."""
    starts, ends = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    paths = ranges["path"].to_numpy()
    rng, seg, overlap = _overlaps(s, starts, ends)
    pieces = pl.DataFrame(
        {
            "path": paths[rng],
            "power_w": s.power[seg],
            "weight": overlap,
            "mostly_inside": 2 * overlap >= np.diff(s.t)[seg],
        },
        schema={
            "path": pl.String,
            "power_w": pl.Float64,
            "weight": pl.Int64,
            "mostly_inside": pl.Boolean,
        },
    ).filter(pl.col("weight") > 0)
    per_range = pl.DataFrame(
        {
            "path": paths,
            "n_samples": np.searchsorted(s.t, ends, "right") - np.searchsorted(s.t, starts, "left"),
            "ramp": _ramps(s, starts, ends),
        },
        schema={"path": pl.String, "n_samples": pl.Int64, "ramp": pl.Float64},
    ).with_columns(pl.col("ramp").fill_nan(None))
    power = pl.col("power_w").sort_by("power_w")
    cum = pl.col("weight").sort_by("power_w").cum_sum()
    total = pl.col("weight").sum()
    levels = pieces.group_by("path").agg(
        power.filter(cum >= 0.5 * total).first().alias("p50_w"),
        power.filter(cum >= 0.95 * total).first().alias("p95_w"),
        pl.coalesce(
            pl.col("power_w").filter(pl.col("mostly_inside")).max(), pl.col("power_w").max()
        ).alias("max_w"),
    )
    ramps = per_range.group_by("path").agg(
        pl.len().cast(pl.Int64).alias("n_ranges"),
        pl.col("n_samples").sum(),
        pl.col("ramp").median().alias("ramp_w_per_ms"),
        pl.col("ramp")
        .sort_by(pl.col("ramp").abs(), descending=True, nulls_last=True)
        .first()
        .alias("ramp_max_w_per_ms"),
    )
    return ramps.join(levels, on="path", how="left").with_columns(
        pl.lit(s.source).alias("power_from"),
        pl.lit(RAMP_READINGS * s.interval_ns / 1e6).alias("ramp_window_ms"),
    )


# --- the table ------------------------------------------------------------------------------------


def envelope(
    phases: pl.DataFrame,
    phase_devices: pl.DataFrame,
    samples: pl.DataFrame,
    hosts: dict[str, str | None],
    total_energy_j: float | None,
) -> pl.DataFrame:
    """The power envelope (:data:`ENVELOPE_SCHEMA`) per phase path: GPU rows, then node rows.

    ``phases``: the phase table (its window rows); ``phase_devices``: window phases per GPU
    (``path, device, energy_j``); ``samples``: ``device, t_ns, power_w, energy_mj`` on the run's
    clock; ``hosts``: device → host. Paths come in the order of their first start; a sampled GPU
    without a usable series keeps its rows, with null power figures.
    """
    ranges = phases.filter(pl.col("attribution") == WINDOW).select("path", "start_ns", "end_ns")
    if ranges.is_empty() or samples.is_empty():
        return pl.DataFrame(schema=ENVELOPE_SCHEMA)
    series = device_series(samples)
    devices = sorted(str(d) for d in samples["device"].unique())
    members: dict[str, list[str]] = {}
    for d in devices:
        if hosts.get(d) is not None and d in series:
            members.setdefault(str(hosts[d]), []).append(d)
    parts = [
        _stats(series.get(d), ranges).with_columns(
            pl.lit("gpu").alias("scope"),
            pl.lit(hosts.get(d), dtype=pl.String).alias("host"),
            pl.lit(d).alias("device"),
            pl.lit(1).alias("n_gpus"),
        )
        for d in devices
    ]
    for host, ds in sorted(members.items()):
        parts.append(
            _stats(node_series([series[d] for d in ds]), ranges).with_columns(
                pl.lit("node").alias("scope"),
                pl.lit(host).alias("host"),
                pl.lit(None, dtype=pl.String).alias("device"),
                pl.lit(len(ds)).alias("n_gpus"),
            )
        )
    unit = pl.when(pl.col("scope") == "gpu").then(pl.col("device")).otherwise(pl.col("host"))
    table = (
        pl.concat([_conform(p) for p in parts])
        .drop("energy_j")
        .with_columns(unit.alias("_unit"))
        .join(_energy(phase_devices, members), on=["scope", "path", "_unit"], how="left")
    )
    order = ranges.group_by("path").agg(pl.col("start_ns").min().alias("_first"))
    share = pl.col("energy_j") / total_energy_j * 100 if total_energy_j else pl.lit(None)
    return _conform(
        table.join(order, on="path")
        .with_columns(
            (pl.col("n_samples") < 2 * pl.col("n_ranges")).alias("few_samples"),
            share.alias("energy_share_pct"),
        )
        .sort("_first", "path", pl.col("scope") == "node", "device", "host")
    )


def _stats(s: Series | None, ranges: pl.DataFrame) -> pl.DataFrame:
    """:func:`unit_stats`, or per path only the range count (no usable series: null figures)."""
    if s is not None:
        return unit_stats(s, ranges)
    return ranges.group_by("path").agg(pl.len().cast(pl.Int64).alias("n_ranges"))


def _conform(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s columns of :data:`ENVELOPE_SCHEMA`, in its order and types (missing: null)."""
    return frame.select(
        (pl.col(c) if c in frame.columns else pl.lit(None)).cast(t).alias(c)
        for c, t in ENVELOPE_SCHEMA.items()
    )


def _energy(phase_devices: pl.DataFrame, members: dict[str, list[str]]) -> pl.DataFrame:
    """``energy_j`` summed over a path's ranges, per GPU and per node (null if any part is)."""
    keys = {"scope": pl.String, "path": pl.String, "_unit": pl.String, "energy_j": pl.Float64}
    if "energy_j" not in phase_devices.columns:
        return pl.DataFrame(schema=keys)
    rows = phase_devices.select("path", pl.col("device").cast(pl.String), "step", "energy_j")
    host_of = pl.DataFrame(
        [(d, h) for h, ds in members.items() for d in ds],
        schema={"device": pl.String, "host": pl.String},
        orient="row",
    )
    parts = []
    for scope, frame, unit in (
        ("gpu", rows, "device"),
        ("node", rows.join(host_of, on="device"), "host"),
    ):
        parts.append(
            frame.sort("path", unit, "device", "step", nulls_last=True)  # stable float sums
            .group_by("path", unit, maintain_order=True)
            .agg(
                pl.when(pl.col("energy_j").null_count() == 0)
                .then(pl.col("energy_j").sum())
                .alias("energy_j")
            )
            .select(pl.lit(scope).alias("scope"), "path", pl.col(unit).alias("_unit"), "energy_j")
        )
    return pl.concat(parts).cast(keys)  # type: ignore[arg-type]


def power_envelope(analysis: Analysis) -> pl.DataFrame | None:
    """:func:`envelope` of an analysis; None without power samples."""
    samples = analysis.power_samples
    if samples is None or samples.is_empty():
        return None
    energy = analysis.summary.energy
    return envelope(
        analysis.phases,
        analysis.phase_devices,
        samples,
        {d.device: d.host for d in analysis.summary.devices},
        energy.total_energy_j if energy is not None else None,
    )
