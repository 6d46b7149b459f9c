"""GPU power samples → one table on the trace clock, cumulative energy, energy over intervals.

Sources: the NVML sampler's Parquet (``nvtx_phases.power``), and power logs of nvidia-smi,
``dcgmi dmon`` and Zeus (:mod:`.power_logs`). The sampler's timestamps are the sampling
process's monotonic clock; the sampler also left NVTX marks ``nvtx_phases.power_clock mono_ns=…``
in the trace, so ``trace time = mono_ns + median(mark time − mark mono_ns)`` over the marks of
that process (matched by host and pid). Without marks, the sampler's wall clock and the trace's
session start are used instead, with a warning (accuracy = the hosts' clock sync). Logs carry
only wall-clock time: ``trace time = UTC time − the traces' clock zero``, with a line per log
saying what it is and lacks.

Energy over an interval comes from the GPU's total-energy counter where every sample has it,
else from the running trapezoid of power at the readings (each interval between two readings
gets their mean power times its length); at the interval's ends, which fall between readings,
that running total is interpolated linearly (inside the reading interval holding an end: its
mean power times the part inside).
nsys's own ``GPU_METRICS`` power samples are not used yet (no export with power metrics was
available to validate their layout against).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from nvtx_phases.naming import CLOCK_MARK_PATTERN, REQUIRED_SAMPLER_COLUMNS

from ..errors import InputError
from ..frames import PolarsDataType, previous_and_next
from ..normalize.devices import normalize_uuid
from .power_logs import SAMPLER_FORMAT as _SAMPLER
from .power_logs import clip_to_capture, is_power_log, log_alignment, log_hosts, log_samples

SAMPLE_COLUMNS = REQUIRED_SAMPLER_COLUMNS

#: Said when energy must come from power readings: measured with ``make gpu-check`` on an H200
#: (checks/results/), NVML's power reading is a ~1 s average there, so its edges trail the work.
AVERAGED_POWER_WARNING = (
    "energy from sampled power (the samples have no energy counter): NVML's power reading is a "
    "~1 s running average on recent GPUs (measured on an H200: edges 0.5 s late; 3 s phases off "
    "by -14% to +80%, the whole run by <1%), so per-phase energy is reliable only for phases "
    "much longer than a second; a GPU with a total-energy counter gives exact phase energy"
)


@dataclass
class PowerData:
    """Samples on the trace clock (``device`` named like GPU operations' devices)."""

    samples: pl.DataFrame  # device, t_ns, power_w, energy_mj
    #: "<format(s)>-counter" or "<format(s)>-power" ("nvml-counter", "nvidia-smi-power",
    #: "dcgm-counter", …), or "" when none
    source: str
    interval_ns: int | None
    alignment: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def load_samples(paths: list[Path]) -> pl.DataFrame:
    """Concatenate power files: sampler Parquet (columns checked; ``uuid`` may be absent) or logs.

    Adds ``format`` (``nvml`` or the log's tool) and ``note`` (a log's one-line description).
    """
    frames = []
    for path in paths:
        if is_power_log(path):
            frames.append(log_samples(path)[0])
            continue
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # polars raises several kinds for a bad file
            raise InputError(f"{path}: cannot read power samples ({exc})") from exc
        missing = [c for c in SAMPLE_COLUMNS if c not in frame.columns]
        if missing:
            raise InputError(f"{path}: power samples lack column(s) {', '.join(missing)}")
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
                pl.lit(_SAMPLER).alias("format"),
                pl.lit(None, dtype=pl.String).alias("note"),
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
    capture_span_ns: tuple[int, int] | None = None,
) -> PowerData:
    """Samples → trace clock and device names; report how each sampler or log was aligned.

    ``aliases``: ``host:deviceId`` → device name, for samples without a UUID. A GPU sampled by
    several samplers (one per process, or two runs' files) keeps the samples of one sampler, the
    one with the most samples: interleaving two samplers' counters would break the energy sums.
    Logs (:mod:`.power_logs`) are placed by their UTC time minus ``origin_utc_ns``, and with
    ``capture_span_ns`` (earliest capture start, latest capture end, on the trace clock) limited
    to it (:func:`.power_logs.clip_to_capture`: a log runs longer than the capture). The
    sampler's samples are kept whole.
    """
    if "format" not in samples.columns:
        samples = samples.with_columns(
            pl.lit(_SAMPLER).alias("format"), pl.lit(None, dtype=pl.String).alias("note")
        )
    samples = log_hosts(samples, aliases or {})
    samples = samples.with_columns(_device_names(samples, aliases or {}).alias("device"))
    samples, warnings = _one_sampler_per_device(samples)
    from_sampler = pl.col("format") == _SAMPLER
    samplers = (
        samples.filter(from_sampler)
        .select("host", "pid")
        .unique()
        .join(_mark_offsets(marks), on=["host", "pid"], how="left")
    )
    alignment, alignment_warnings = _alignment_methods(samplers)
    logs_aligned, log_warnings = log_alignment(samples, origin_utc_ns)
    alignment += logs_aligned
    warnings += alignment_warnings + log_warnings
    joined = samples.join(samplers, on=["host", "pid"], how="left")
    origin = origin_utc_ns if origin_utc_ns is not None else 0
    aligned = joined.select(
        "device",
        pl.when(pl.col("offset_ns").is_not_null() & from_sampler)
        .then(pl.col("mono_ns") + pl.col("offset_ns"))
        .otherwise(pl.col("wall_ns") - origin)
        .alias("t_ns"),
        "power_w",
        "energy_mj",
        "source",
        from_sampler.alias("sampler"),
    ).sort("device", "t_ns")
    if capture_span_ns is not None and not aligned["sampler"].all():
        logs, notes = clip_to_capture(aligned.filter(~pl.col("sampler")), capture_span_ns)
        sampled = aligned.filter(pl.col("sampler")).with_columns(pl.lit(True).alias("reading"))
        aligned = pl.concat([sampled, logs], how="diagonal_relaxed").sort("device", "t_ns")
        warnings += notes
    aligned = aligned.drop("source", "sampler")
    unknown = sorted(set(aligned["device"].unique()) - set(op_devices))
    if op_devices and unknown:
        warnings.append(
            f"power samples for GPU(s) {', '.join(unknown)} that ran no traced operation, so "
            "their idle power is not measured (pass --idle-power-w); samples without a UUID "
            "are matched by NVML index, which is CUDA's order only with CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    has_counter = aligned.height > 0 and aligned["energy_mj"].null_count() == 0
    if aligned.height and not has_counter:
        warnings.append(AVERAGED_POWER_WARNING)
    readings = aligned.filter(pl.col("reading")) if "reading" in aligned.columns else aligned
    dt = (
        readings.select(pl.col("t_ns").diff().over("device").median()).item()
        if readings.height > 1
        else None
    )
    formats = "+".join(sorted(set(samples["format"].unique()))) if aligned.height else ""
    return PowerData(
        samples=aligned,
        source=f"{formats}-{'counter' if has_counter else 'power'}" if aligned.height else "",
        interval_ns=int(dt) if dt is not None else None,
        alignment=alignment,
        warnings=warnings,
    )


def _mark_offsets(marks: pl.DataFrame) -> pl.DataFrame:
    """Per sampler (host, pid): trace time − sampler clock, from its clock marks, and spread."""
    clock = (
        marks.with_columns(pl.col("text").str.extract_groups(CLOCK_MARK_PATTERN).alias("m"))
        .filter(pl.col("m").struct.field("1").is_not_null())
        .select(
            "host",
            "pid",
            "ts_ns",
            pl.col("m").struct.field("1").cast(pl.Int64).alias("mark_mono_ns"),
        )
    )
    delta = pl.col("ts_ns") - pl.col("mark_mono_ns")
    return clock.group_by("host", "pid").agg(
        delta.median().round().cast(pl.Int64).alias("offset_ns"),
        (delta.max() - delta.min()).alias("spread_ns"),
        pl.len().alias("n_marks"),
    )


def _alignment_methods(samplers: pl.DataFrame) -> tuple[list[dict[str, Any]], list[str]]:
    """How each sampler is put on the trace clock: its clock marks, else the wall clock."""
    alignment, warnings = [], []
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
    return alignment, warnings


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
    if power.source.endswith("-counter"):
        cum = (pl.col("energy_mj") - pl.col("energy_mj").first().over("device")) / 1000.0
    else:
        dt_s = pl.col("t_ns").diff().over("device").fill_null(0) / 1e9
        mean_w = (pl.col("power_w") + pl.col("power_w").shift(1).over("device")) / 2
        cum = (mean_w.fill_null(0) * dt_s).cum_sum().over("device")
    # rows put at a capture's ends (``reading`` false, :func:`align`) are no readings
    extra = ["reading"] if "reading" in samples.columns else []
    return samples.with_columns(cum.alias("cum_j")).select(
        "device", "t_ns", "power_w", "cum_j", *extra
    )


def energy_at(cum: pl.DataFrame, queries: pl.DataFrame) -> pl.DataFrame:
    """``cum_j`` at each query (``device``, ``t_ns``), linearly interpolated, clamped to the samples."""
    right = cum.select("device", "t_ns", "cum_j").sort("t_ns")
    left = queries.with_row_index("_q").sort("t_ns")
    both = previous_and_next(
        left,
        right,
        left_on="t_ns",
        right_on="t_ns",
        before={"t_ns": "t0", "cum_j": "c0"},
        after={"t_ns": "t1", "cum_j": "c1"},
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
    readings = cum.filter(pl.col("reading")) if "reading" in cum.columns else cum
    for (device,), samples in readings.sort("t_ns").group_by("device", maintain_order=True):
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
    schema: dict[str, PolarsDataType] = {
        "id": intervals.schema["id"],
        "device": pl.String,
        "n_samples": pl.Int64,
        "peak_power_w": pl.Float64,
    }
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


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
