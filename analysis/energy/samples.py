"""GPU power samples → one table on the trace clock, cumulative energy, energy over intervals.

Source: the NVML sampler's Parquet (``nvtx_phases.power``). Its timestamps are the sampling
process's monotonic clock; the sampler also left NVTX marks ``nvtx_phases.power_clock mono_ns=…``
in the trace, so ``trace time = mono_ns + median(mark time − mark mono_ns)`` over the marks of
that process (matched by host and pid). Without marks, the sampler's wall clock and the trace's
session start are used instead, with a warning (accuracy = the hosts' clock sync).

Energy over an interval comes from the GPU's total-energy counter where every sample has it
(linear interpolation at the interval's ends), else from trapezoidal integration of power.
nsys's own ``GPU_METRICS`` power samples are not used yet (no export with power metrics was
available to validate their layout against).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis.errors import AnalysisError
from analysis.normalize.devices import normalize_uuid
from nvtx_phases.power import CLOCK_MARK

SAMPLE_COLUMNS = ("host", "pid", "device", "wall_ns", "mono_ns", "power_w", "energy_mj")
_MARK_PATTERN = re.escape(CLOCK_MARK) + r" mono_ns=(\d+) wall_ns=(\d+)"


@dataclass
class PowerData:
    """Samples on the trace clock (``device`` named like GPU operations' devices)."""

    samples: pl.DataFrame  # device, t_ns, power_w, energy_mj
    source: str  # "nvml-counter", "nvml-power", or "" when none
    interval_ns: int | None
    alignment: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def load_samples(paths: list[Path]) -> pl.DataFrame:
    """Concatenate sampler Parquet files, checking their columns (``uuid`` may be absent)."""
    frames = []
    for path in paths:
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # polars raises several kinds for a bad file
            raise AnalysisError(f"{path}: cannot read power samples ({exc})") from exc
        missing = [c for c in SAMPLE_COLUMNS if c not in frame.columns]
        if missing:
            raise AnalysisError(f"{path}: power samples lack column(s) {', '.join(missing)}")
        frames.append(
            frame.select(
                pl.col("host").cast(pl.String),
                pl.col("pid").cast(pl.Int64),
                pl.col("device").cast(pl.Int64),
                (pl.col("uuid") if "uuid" in frame.columns else pl.lit(None))
                .cast(pl.String)
                .alias("uuid"),
                pl.col("wall_ns").cast(pl.Int64),
                pl.col("mono_ns").cast(pl.Int64),
                pl.col("power_w").cast(pl.Float64),
                pl.col("energy_mj").cast(pl.Int64),
                # two runs' samplers can share host, pid and clock readings: the file tells them apart
                pl.lit(str(path)).alias("source"),
            )
        )
    return pl.concat(frames) if frames else pl.DataFrame()


def _device_names(samples: pl.DataFrame, aliases: dict[str, str]) -> pl.Expr:
    """Each sample's GPU under the trace's device names.

    By UUID where the sampler recorded one (the same name the trace gives that GPU); else by
    ``host:NVML index`` through ``aliases`` (``host:deviceId`` of the traced devices), which
    agrees with CUDA's numbering only with CUDA_DEVICE_ORDER=PCI_BUS_ID.
    """
    by_index = pl.col("host") + ":" + pl.col("device").cast(pl.String)
    return pl.coalesce(
        normalize_uuid(pl.col("uuid")),
        by_index.replace_strict(aliases, default=by_index, return_dtype=pl.String)
        if aliases
        else by_index,
    )


def align(
    samples: pl.DataFrame,
    marks: pl.DataFrame,
    *,
    origin_utc_ns: int | None,
    op_devices: list[str],
    aliases: dict[str, str] | None = None,
) -> PowerData:
    """Samples → trace clock and device names; report how each sampler was aligned.

    ``aliases``: ``host:deviceId`` → device name, for samples without a UUID. A GPU sampled by
    several samplers (one per process, or two runs' files) keeps the samples of one sampler, the
    one with the most samples: interleaving two samplers' counters would break the energy sums.
    """
    warnings: list[str] = []
    clock = (
        marks.with_columns(pl.col("text").str.extract_groups(_MARK_PATTERN).alias("m"))
        .filter(pl.col("m").struct.field("1").is_not_null())
        .select(
            "host",
            "pid",
            "ts_ns",
            pl.col("m").struct.field("1").cast(pl.Int64).alias("mark_mono_ns"),
        )
    )
    offsets = clock.group_by("host", "pid").agg(
        (pl.col("ts_ns") - pl.col("mark_mono_ns"))
        .median()
        .round()
        .cast(pl.Int64)
        .alias("offset_ns"),
        (
            (pl.col("ts_ns") - pl.col("mark_mono_ns")).max()
            - (pl.col("ts_ns") - pl.col("mark_mono_ns")).min()
        ).alias("spread_ns"),
        pl.len().alias("n_marks"),
    )
    samples = samples.with_columns(_device_names(samples, aliases or {}).alias("device"))
    samples, duplicate_warnings = _one_sampler_per_device(samples)
    warnings += duplicate_warnings
    samplers = samples.select("host", "pid").unique().join(offsets, on=["host", "pid"], how="left")
    alignment = []
    for row in samplers.sort("host", "pid").iter_rows(named=True):
        if row["offset_ns"] is None:
            method = "wall clock"
            warnings.append(
                f"power samples of {row['host']} pid {row['pid']}: no clock marks in the traces; "
                "aligned by wall clock (accuracy = clock sync between hosts)"
            )
        else:
            method = "clock marks"
        alignment.append({**row, "method": method})
    joined = samples.join(samplers, on=["host", "pid"], how="left")
    origin = origin_utc_ns if origin_utc_ns is not None else 0
    aligned = joined.select(
        "device",
        pl.when(pl.col("offset_ns").is_not_null())
        .then(pl.col("mono_ns") + pl.col("offset_ns"))
        .otherwise(pl.col("wall_ns") - origin)
        .alias("t_ns"),
        "power_w",
        "energy_mj",
    ).sort("device", "t_ns")
    unknown = sorted(set(aligned["device"].unique()) - set(op_devices))
    if op_devices and unknown:
        warnings.append(
            f"power samples for GPU(s) {', '.join(unknown)} that ran no traced operation "
            "(samples without a UUID are matched by NVML index, which agrees with CUDA's "
            "device numbering only with CUDA_DEVICE_ORDER=PCI_BUS_ID)"
        )
    has_counter = aligned.height > 0 and aligned["energy_mj"].null_count() == 0
    dt = (
        aligned.select(pl.col("t_ns").diff().over("device").median()).item()
        if aligned.height > 1
        else None
    )
    return PowerData(
        samples=aligned,
        source=("nvml-counter" if has_counter else "nvml-power") if aligned.height else "",
        interval_ns=int(dt) if dt is not None else None,
        alignment=alignment,
        warnings=warnings,
    )


def _one_sampler_per_device(samples: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """Keep, per GPU, the samples of the sampler (file, host, pid) that took the most of them."""
    sampler = ["source", "host", "pid"]
    counts = (
        samples.group_by("device", *sampler)
        .agg(pl.len().alias("n"))
        .sort(["device", "n", *sampler], descending=[False, True, False, False, False])
    )
    chosen = counts.unique(subset="device", keep="first", maintain_order=True)
    if chosen.height == counts.height:
        return samples, []
    shared = counts.group_by("device").agg(pl.len().alias("k")).filter(pl.col("k") > 1)
    names = ", ".join(shared.sort("device")["device"].to_list())
    warning = (
        f"GPU(s) {names} sampled by more than one power sampler (one per process, or files of "
        "different runs): the samples of the sampler with the most samples are used per GPU"
    )
    kept = samples.join(chosen.select("device", *sampler), on=["device", *sampler])
    return kept, [warning]


def cumulative_energy(power: PowerData) -> pl.DataFrame:
    """Per device and sample: ``cum_j``, energy since the device's first sample."""
    samples = power.samples.sort("device", "t_ns")
    if power.source == "nvml-counter":
        cum = (pl.col("energy_mj") - pl.col("energy_mj").first().over("device")) / 1000.0
    else:
        dt_s = pl.col("t_ns").diff().over("device").fill_null(0) / 1e9
        mean_w = (pl.col("power_w") + pl.col("power_w").shift(1).over("device")) / 2
        cum = (mean_w.fill_null(0) * dt_s).cum_sum().over("device")
    return samples.with_columns(cum.alias("cum_j")).select("device", "t_ns", "power_w", "cum_j")


def energy_at(cum: pl.DataFrame, queries: pl.DataFrame) -> pl.DataFrame:
    """``cum_j`` at each query (``device``, ``t_ns``), linearly interpolated, clamped to the samples."""
    right = cum.select("device", "t_ns", "cum_j").sort("t_ns")
    left = queries.with_row_index("_q").sort("t_ns")
    before = left.join_asof(
        right.rename({"t_ns": "t0", "cum_j": "c0"}),
        left_on="t_ns",
        right_on="t0",
        by="device",
        strategy="backward",
        check_sortedness=False,  # sorted on the key globally, hence within each group
    )
    both = before.join_asof(
        right.rename({"t_ns": "t1", "cum_j": "c1"}),
        left_on="t_ns",
        right_on="t1",
        by="device",
        strategy="forward",
        check_sortedness=False,  # sorted on the key globally, hence within each group
    )
    value = (
        pl.when(pl.col("t0").is_null())
        .then(pl.col("c1"))  # before the first sample: nothing measured yet
        .when(pl.col("t1").is_null() | (pl.col("t1") == pl.col("t0")))
        .then(pl.col("c0"))
        .otherwise(
            pl.col("c0")
            + (pl.col("c1") - pl.col("c0"))
            * (pl.col("t_ns") - pl.col("t0"))
            / (pl.col("t1") - pl.col("t0"))
        )
    )
    return both.with_columns(value.alias("cum_j")).sort("_q").drop("_q", "t0", "c0", "t1", "c1")


def interval_energy(cum: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """Energy of each interval (``id``, ``device``, ``start_ns``, ``end_ns``) on its device.

    Adds ``energy_j``, ``n_samples`` (samples inside) and ``peak_power_w`` (highest of them,
    null when there are none).
    """
    if intervals.is_empty():
        return intervals.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("energy_j"),
            pl.lit(0, dtype=pl.Int64).alias("n_samples"),
            pl.lit(None, dtype=pl.Float64).alias("peak_power_w"),
        )
    at_start = energy_at(cum, intervals.select("device", pl.col("start_ns").alias("t_ns")))["cum_j"]
    at_end = energy_at(cum, intervals.select("device", pl.col("end_ns").alias("t_ns")))["cum_j"]
    result = intervals.with_columns((at_end - at_start).alias("energy_j"))
    inside = _samples_inside(cum, result)
    return result.join(inside, on=["id", "device"], how="left").with_columns(
        pl.col("n_samples").fill_null(0)
    )


def _samples_inside(cum: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """Per interval: samples taken inside it and the highest power among them."""
    parts = []
    for (device,), samples in cum.sort("t_ns").group_by("device", maintain_order=True):
        mine = intervals.filter(pl.col("device") == device)
        if mine.is_empty():
            continue
        t = samples["t_ns"]
        indexed = samples.select(pl.int_range(pl.len()).alias("i"), "power_w")
        parts.append(
            mine.select("id", "device")
            .with_columns(
                t.search_sorted(mine["start_ns"], side="left").alias("lo"),
                t.search_sorted(mine["end_ns"], side="right").alias("hi"),
            )
            .with_columns(pl.int_ranges("lo", "hi").alias("i"))
            .explode("i")
            .join(indexed, on="i", how="left")
            .group_by("id", "device")
            .agg(
                pl.col("power_w").count().cast(pl.Int64).alias("n_samples"),
                pl.col("power_w").max().alias("peak_power_w"),
            )
        )
    schema = {
        "id": intervals.schema["id"],
        "device": pl.String,
        "n_samples": pl.Int64,
        "peak_power_w": pl.Float64,
    }
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


def idle_guard_ns(interval_ns: int | None) -> int:
    """How far from any GPU operation a sample must be to count as idle."""
    return max(10 * (interval_ns or 0), 1_000_000)


def busy_blocks(intervals: pl.DataFrame, *, merge_gap_ns: int = 0) -> pl.DataFrame:
    """Busy stretches per device (``device, start_ns, end_ns``).

    Intervals merge when they overlap, touch, or lie less than ``merge_gap_ns`` apart.

    With ``merge_gap_ns = 2 × idle_guard_ns`` the blocks are few (one per idle stretch), and
    merging blocks of parts of a run gives the blocks of the whole run.
    """
    return (
        intervals.select("device", "start_ns", "end_ns")
        .sort("device", "start_ns")
        .with_columns(pl.col("end_ns").cum_max().shift(1).over("device").alias("_reach"))
        .with_columns(
            (
                pl.col("_reach").is_null()
                | (pl.col("start_ns") - pl.col("_reach") >= max(merge_gap_ns, 1))
            )
            .cum_sum()
            .over("device")
            .alias("_block")
        )
        .group_by("device", "_block")
        .agg(pl.col("start_ns").min(), pl.col("end_ns").max())
        .select("device", "start_ns", "end_ns")
        .sort("device", "start_ns")
    )


def idle_baseline(
    cum: pl.DataFrame, blocks: pl.DataFrame, *, interval_ns: int | None
) -> pl.DataFrame:
    """Median power per device over samples taken in long GPU-idle stretches: ``idle_power_w``.

    A sample counts as idle when no operation runs on its device for at least
    max(10 sampling intervals, 1 ms) around it, so gaps between kernels inside a busy phase do
    not count. Devices with fewer than 5 such samples get null (then pass ``--idle-power-w``).
    ``blocks``: :func:`busy_blocks` of the run's operations (merged up to 2 × that guard, which
    changes no sample's verdict: a gap shorter than two guards holds no idle sample).
    """
    guard = idle_guard_ns(interval_ns)
    busy = blocks.sort("start_ns")
    samples = cum.select("device", "t_ns", "power_w").sort("t_ns")
    prev = samples.join_asof(
        busy.rename({"start_ns": "prev_start", "end_ns": "prev_end"}),
        left_on="t_ns",
        right_on="prev_start",
        by="device",
        strategy="backward",
        check_sortedness=False,  # sorted on the key globally, hence within each group
    )
    both = prev.join_asof(
        busy.rename({"start_ns": "next_start", "end_ns": "next_end"}),
        left_on="t_ns",
        right_on="next_start",
        by="device",
        strategy="forward",
        check_sortedness=False,  # sorted on the key globally, hence within each group
    )
    idle = both.filter(
        (pl.col("prev_end").is_null() | (pl.col("t_ns") - pl.col("prev_end") >= guard))
        & (pl.col("next_start").is_null() | (pl.col("next_start") - pl.col("t_ns") >= guard))
    )
    stats = idle.group_by("device").agg(
        pl.col("power_w").median().alias("idle_power_w"), pl.len().alias("n")
    )
    return (
        cum.select("device")
        .unique()
        .join(stats, on="device", how="left")
        .with_columns(pl.when(pl.col("n") >= 5).then(pl.col("idle_power_w")).alias("idle_power_w"))
        .select("device", "idle_power_w")
        .sort("device")
    )
