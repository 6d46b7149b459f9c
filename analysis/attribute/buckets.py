"""Attribute a whole run's GPU operations to its phase ranges, one time bucket at a time.

The pure core of ``analyze``: in-memory frames on one clock in, an :class:`Analysis` out. A run
comes as buckets of operations in time order (one bucket when it fits in memory); every
per-range figure is a sum, min, max or set over operations, except busy time (a union), which
:class:`~analysis.attribute.intervals.BusyAccumulator` carries across bucket edges, so any bucketing gives
the single-pass result.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis.aggregate import phases as aggregate
from analysis.attribute import operations as attribute
from analysis.attribute.hierarchy import build_hierarchy
from analysis.attribute.intervals import BusyAccumulator
from analysis.attribute.phase_map import PhaseMap
from analysis.energy import phases as energy
from analysis.energy.samples import PowerData, busy_blocks, idle_guard_ns
from analysis.normalize.events import OPS_SCHEMA
from analysis.normalize.launches import CALL_COLUMNS
from analysis.run.spill import write_part

PROJECTION = "projection"
WINDOW = "window"


@dataclass
class Analysis:
    """Everything ``analyze`` computes; frames are ready to write."""

    phases: pl.DataFrame
    phase_devices: pl.DataFrame
    #: One row per GPU operation; for a run attributed in several buckets, a lazy scan of
    #: Parquet parts in a temporary folder that lives as long as this object.
    gpu_activity: pl.DataFrame | pl.LazyFrame
    kernels: pl.DataFrame
    steps: pl.DataFrame
    summary: dict
    warnings: list[str] = field(default_factory=list)
    #: Power samples on the run's clock (``device, t_ns, power_w, energy_mj``), if any.
    power_samples: pl.DataFrame | None = None


def concat_or_empty(frames: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
    """The non-empty ``frames`` stacked, or an empty frame of ``schema`` when there are none."""
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=schema)


@dataclass
class Bucket:
    """The GPU operations (with ``op_id``, linked to launches) starting in ``[lo_ns, hi_ns)``."""

    lo_ns: int | None
    hi_ns: int | None
    ops: pl.DataFrame


def attribute_run(
    ranges: pl.DataFrame,
    ops: pl.DataFrame,
    runtime: pl.DataFrame,
    phase_map: PhaseMap,
    *,
    power: PowerData | None = None,
    idle_power_w: float | None = None,
    edges: Sequence[int] = (),
) -> Analysis:
    """The pure core on in-memory frames of a whole run (one clock) → :class:`Analysis`.

    ``ops`` need an ``op_id`` column. ``edges``: bucket the operations at these instants
    (for tests: the result must not change).
    """
    launches = attribute.link_launches(ops, runtime)
    linked = launches.ops
    bounds: list[int | None] = [None, *sorted(set(edges)), None]
    buckets = (
        Bucket(
            lo,
            hi,
            linked.filter(
                (pl.col("start_ns") >= lo if lo is not None else pl.lit(True))
                & (pl.col("start_ns") < hi if hi is not None else pl.lit(True))
            ),
        )
        for lo, hi in itertools.pairwise(bounds)
    )
    return attribute_buckets(
        ranges,
        launches.launch_threads,
        sorted(linked["device"].drop_nulls().unique().to_list()),
        buckets,
        phase_map,
        power=power,
        idle_power_w=idle_power_w,
        launch_warnings=launches.warnings,
    )


def attribute_buckets(
    ranges: pl.DataFrame,
    launch_threads: pl.DataFrame,
    devices: list[str],
    buckets: Iterable[Bucket],
    phase_map: PhaseMap,
    *,
    power: PowerData | None = None,
    idle_power_w: float | None = None,
    launch_warnings: Sequence[str] = (),
    activity_dir: Path | None = None,
) -> Analysis:
    """Attribute a run's operations, bucket by bucket in time order, to its phase ranges.

    Everything per range is a sum, min, max or set over operations, except busy time (a
    union), which :class:`~analysis.attribute.intervals.BusyAccumulator` carries across buckets; so the
    result equals a single pass. ``activity_dir``: write each bucket's per-operation rows
    there (``gpu_activity`` is then a lazy scan of them) instead of holding them in memory.
    """
    hierarchy = build_hierarchy(ranges, phase_map)
    phases = hierarchy.phases
    warnings = [*hierarchy.warnings, *launch_warnings]
    on_launch_thread = phases.join(
        launch_threads.with_columns(pl.lit(True).alias("launches")),
        on=attribute.THREAD,
        how="left",
    )["launches"].fill_null(False)
    phases = phases.with_columns(
        pl.when(on_launch_thread)
        .then(pl.lit(PROJECTION))
        .otherwise(pl.lit(WINDOW))
        .alias("attribution")
    )
    proj_ranges = phases.filter(pl.col("attribution") == PROJECTION)
    window_ranges = phases.filter(pl.col("attribution") == WINDOW)
    timeline = window_ranges if window_ranges.height else phases
    timeline_source = "driver" if window_ranges.height else "all"
    boundaries, innermost = attribute.window_layout(timeline)

    sums = _RunSums(devices, activity_dir, power)
    for bucket in buckets:
        sums.add(bucket, proj_ranges, boundaries, innermost, phases, hierarchy.steps)
    proj_metrics = aggregate.merge_projection(
        sums.proj_sums or [_EMPTY_SUMS_RID],
        concat_or_empty(sums.proj_devices, {"rid": pl.Int64, "device": pl.String}).unique(),
        sums.proj_busy.result(),
    )
    seg_dev = aggregate.merge_segments(sums.seg_sums or [_EMPTY_SUMS_SEG], sums.seg_busy.result())

    n_devices = len(devices)
    range_segs = attribute.range_segments(window_ranges, boundaries)
    per_device, win_metrics = aggregate.window_metrics(range_segs, seg_dev)
    win_metrics = (
        window_ranges.select("rid")
        .join(win_metrics, on="rid", how="left")
        .with_columns(pl.lit(n_devices, dtype=pl.Int64).alias("n_devices"))
    )

    metrics = pl.concat(
        [
            proj_metrics.filter(pl.col("rid").is_in(proj_ranges["rid"].implode())),
            win_metrics,
        ],
        how="diagonal_relaxed",
    )
    energy_summary: dict = {"power_source": None}
    if power is not None and power.samples.height:
        phase_energy = energy.phase_energy(
            phases,
            concat_or_empty(sums.proj_devices, {"rid": pl.Int64, "device": pl.String}).unique(),
            sums.blocks(),
            power,
            idle_power_w=idle_power_w,
        )
        range_energy, device_energy, idle = (
            phase_energy.per_range,
            phase_energy.per_device,
            phase_energy.idle,
        )
        warnings += phase_energy.warnings
        metrics = metrics.join(range_energy, on="rid", how="full", coalesce=True)
        per_device = per_device.join(device_energy, on=["rid", "device"], how="full", coalesce=True)
        balance, balance_warnings = energy.energy_balance(power, timeline)
        warnings += balance_warnings
        energy_summary = {
            **balance,
            "power_source": power.source,
            "power_interval_ns": power.interval_ns,
            "power_alignment": power.alignment,
            "idle_power_w": dict(idle.iter_rows()),
        }
        missing_idle = idle.filter(pl.col("idle_power_w").is_null())["device"].to_list()
        if missing_idle:
            warnings.append(
                f"no idle baseline for GPU(s) {', '.join(missing_idle)} (too few idle samples); "
                "energy_above_idle_j is null: pass --idle-power-w"
            )
        short = phases.join(range_energy.filter(pl.col("below_sampling_interval")), on="rid").height
        if short:
            warnings.append(
                f"{short} phase range(s) are shorter than the power sampling interval "
                f"({(power.interval_ns or 0) / 1e6:.1f} ms): their energy is interpolated "
                "(below_sampling_interval)"
            )
    else:
        metrics = metrics.with_columns(
            pl.lit(None, dtype=dtype).alias(name) for name, dtype in energy.ENERGY_COLUMNS.items()
        )
    table = aggregate.phase_table(phases, metrics)
    totals = sums.totals()
    if not totals["gpu_time_conserved"]:
        warnings.append(
            "GPU time not conserved: attributed + unattributed differs from the operations' "
            f"total ({totals['total_gpu_ns']} ns) — please report this trace"
        )
    summary = {
        **totals,
        "window_timeline": timeline_source,
        "n_phase_ranges": phases.height,
        "n_devices": n_devices,
        "n_steps": hierarchy.steps.height,
        **energy_summary,
    }
    return Analysis(
        phases=table,
        phase_devices=_phase_devices(phases, per_device, devices),
        gpu_activity=sums.activity(),
        kernels=aggregate.kernel_table(sums.kernels or [aggregate.kernel_partial(_EMPTY_OPS)]),
        steps=hierarchy.steps,
        summary=summary,
        warnings=warnings,
        power_samples=power.samples if power is not None else None,
    )


class _RunSums:
    """What :func:`attribute_buckets` keeps of each bucket.

    Partial sums, busy accumulators, the per-operation rows (in memory or written out) and the
    run's totals.
    """

    def __init__(
        self, devices: list[str], activity_dir: Path | None, power: PowerData | None
    ) -> None:
        self.proj_sums: list[pl.DataFrame] = []
        self.proj_devices: list[pl.DataFrame] = []
        self.proj_busy = BusyAccumulator({"rid": pl.Int64, "device": pl.String})
        self.seg_sums: list[pl.DataFrame] = []
        self.seg_busy = BusyAccumulator({"seg": pl.Int64, "device": pl.String})
        self.kernels: list[pl.DataFrame] = []
        self.activity_dir = activity_dir
        self.activity_parts: list[pl.DataFrame] = []
        self.activity_files: list[Path] = []
        self._blocks: list[pl.DataFrame] = []
        self._merge_gap_ns = 2 * idle_guard_ns(power.interval_ns) if power is not None else None
        self._totals: dict[str, int] = dict.fromkeys(_TOTALS, 0)

    def add(
        self,
        bucket: Bucket,
        proj_ranges: pl.DataFrame,
        boundaries: pl.Series,
        innermost: pl.DataFrame,
        phases: pl.DataFrame,
        steps: pl.DataFrame,
    ) -> None:
        """Attribute one bucket's operations and keep what the run needs of them."""
        ops = bucket.ops
        pairs = attribute.projection_pairs(ops, proj_ranges)
        proj_sums, proj_devices, proj_busy = aggregate.projection_partials(pairs, ops, proj_ranges)
        self.proj_sums.append(proj_sums)
        self.proj_devices.append(proj_devices)
        self.proj_busy.add(proj_busy, bucket.hi_ns)
        pieces = attribute.window_pieces(ops, boundaries, innermost)
        seg_sums, seg_busy = aggregate.segment_partials(pieces)
        self.seg_sums.append(seg_sums)
        self.seg_busy.add(seg_busy, bucket.hi_ns)
        self.kernels.append(aggregate.kernel_partial(ops))
        if self._merge_gap_ns is not None:
            self._blocks.append(busy_blocks(ops, merge_gap_ns=self._merge_gap_ns))
        activity = _gpu_activity(ops, pairs, pieces, phases, steps)
        self._count(ops, pieces, activity)
        if self.activity_dir is None:
            self.activity_parts.append(activity)
        else:
            self.activity_dir.mkdir(exist_ok=True)
            part = self.activity_dir / f"part-{len(self.activity_files):05d}.parquet"
            write_part(activity, part)
            self.activity_files.append(part)

    def _count(self, ops: pl.DataFrame, pieces: pl.DataFrame, activity: pl.DataFrame) -> None:
        kind, dur = pl.col("kind"), pl.col("dur_ns")
        counted = activity.select(
            dur.sum().alias("total_gpu_ns"),
            dur.filter(pl.col("projection_path").is_not_null())
            .sum()
            .alias("projection_attributed_gpu_ns"),
            pl.len().alias("n_gpu_ops"),
            (kind == "kernel").sum().alias("n_kernels"),
            dur.filter(kind == "kernel").sum().alias("kernel_ns"),
            dur.filter(pl.col("op_class") == "nccl").sum().alias("nccl_ns"),
            dur.filter(kind == "memcpy").sum().alias("memcpy_ns"),
            pl.col("bytes").filter(kind == "memcpy").sum().alias("memcpy_bytes"),
            dur.filter(kind == "memset").sum().alias("memset_ns"),
            dur.filter(kind == "graph").sum().alias("graph_ns"),
            (kind == "graph").sum().alias("n_graphs"),
        ).row(0, named=True)
        # both parts summed from the split pieces, not one as the other's remainder: their sum
        # equals the operations' own total only if splitting lost and doubled nothing
        counted["attributed_gpu_ns"] = pieces.filter(pl.col("rid").is_not_null())[
            "overlap_ns"
        ].sum()
        counted["unattributed_gpu_ns"] = pieces.filter(pl.col("rid").is_null())["overlap_ns"].sum()
        counted["projection_unattributed_gpu_ns"] = activity.filter(
            pl.col("projection_path").is_null()
        )["dur_ns"].sum()
        for name in _TOTALS:
            self._totals[name] += int(counted[name] or 0)

    def totals(self) -> dict[str, int]:
        """The run's GPU time totals, attributed and not, under both schemes, and counts."""
        t = self._totals
        return {
            "total_gpu_ns": t["total_gpu_ns"],
            "attributed_gpu_ns": t["attributed_gpu_ns"],
            "unattributed_gpu_ns": t["unattributed_gpu_ns"],
            "projection_attributed_gpu_ns": t["projection_attributed_gpu_ns"],
            "projection_unattributed_gpu_ns": t["projection_unattributed_gpu_ns"],
            "gpu_time_conserved": (
                t["attributed_gpu_ns"] + t["unattributed_gpu_ns"] == t["total_gpu_ns"]
                and t["projection_attributed_gpu_ns"] + t["projection_unattributed_gpu_ns"]
                == t["total_gpu_ns"]
            ),
            **{k: t[k] for k in _TOTALS if k.startswith(("n_", "kernel", "nccl", "mem", "graph"))},
        }

    def blocks(self) -> pl.DataFrame:
        """Busy stretches per device over the whole run (for the idle power baseline)."""
        frames = self._blocks or [pl.DataFrame(schema={k: OPS_SCHEMA[k] for k in _BLOCK})]
        return busy_blocks(pl.concat(frames), merge_gap_ns=self._merge_gap_ns or 0)

    def activity(self) -> pl.DataFrame | pl.LazyFrame:
        """Every operation's row: in memory, or a lazy scan of the parts written per bucket."""
        if self.activity_files:
            return pl.scan_parquet(self.activity_files)
        if self.activity_parts:
            return pl.concat(self.activity_parts)
        return _gpu_activity(
            _EMPTY_OPS,
            pl.DataFrame(schema={"op_id": pl.Int64, "rid": pl.Int64}),
            attribute.window_pieces(_EMPTY_OPS, pl.Series([], dtype=pl.Int64), _EMPTY_INNERMOST),
            pl.DataFrame(
                schema={"rid": pl.Int64, "path": pl.String, "step": pl.Int64, "level": pl.Int32}
            ),
            pl.DataFrame(),
        )


_TOTALS = (
    "total_gpu_ns",
    "attributed_gpu_ns",
    "unattributed_gpu_ns",
    "projection_attributed_gpu_ns",
    "projection_unattributed_gpu_ns",
    "n_gpu_ops",
    "n_kernels",
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "graph_ns",
    "n_graphs",
)
_BLOCK = ("device", "start_ns", "end_ns")
_EMPTY_OPS = pl.DataFrame(schema={**OPS_SCHEMA, **CALL_COLUMNS, "op_id": pl.Int64})
_EMPTY_INNERMOST = pl.DataFrame(schema={"seg": pl.Int64, "rid": pl.Int64})
_EMPTY_SUMS_RID = aggregate.projection_partials(
    pl.DataFrame(schema={"op_id": pl.Int64, "rid": pl.Int64}),
    _EMPTY_OPS,
    pl.DataFrame(schema={"rid": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64}),
)[0]
_EMPTY_SUMS_SEG = aggregate.segment_partials(
    attribute.window_pieces(_EMPTY_OPS, pl.Series([], dtype=pl.Int64), _EMPTY_INNERMOST)
)[0]


def _phase_devices(
    phases: pl.DataFrame, per_device: pl.DataFrame, run_devices: list[str]
) -> pl.DataFrame:
    """Window phases per device: where each rank's GPU was busy or idle during a driver phase."""
    keys = ["trace", "pid", "step", "path", "phase"]
    window = phases.filter(pl.col("attribution") == WINDOW).select(
        "rid",
        *[k for k in keys if k != "phase"],
        pl.col("name").alias("phase"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"),
    )
    devices = pl.concat(
        [
            pl.DataFrame({"device": run_devices}, schema={"device": pl.String}),
            per_device.select("device"),
        ]
    ).unique()
    grid = window.join(devices, how="cross").join(per_device, on=["rid", "device"], how="left")
    filled = grid.with_columns(
        [pl.col(m).fill_null(0) for m in (*aggregate.METRICS, "gpu_busy_ns")]
    ).with_columns((pl.col("wall_ns") - pl.col("gpu_busy_ns")).alias("idle_ns"))
    energy_aggs = (
        [
            aggregate.sum_or_null("energy_j"),
            aggregate.sum_or_null("energy_above_idle_j"),
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
            *(pl.col(m).sum() for m in aggregate.METRICS),
            *energy_aggs,
        )
        # every key: rows of several traces share (step, path, device)
        .sort(["step", "path", "device", "trace", "pid", "phase"], nulls_last=True)
    )


def _gpu_activity(
    ops: pl.DataFrame,
    pairs: pl.DataFrame,
    pieces: pl.DataFrame,
    phases: pl.DataFrame,
    steps: pl.DataFrame,
) -> pl.DataFrame:
    """Every GPU operation with its step and phase path under each scheme (null: unattributed)."""
    info = phases.select("rid", "path", "step", "level")
    innermost_proj = (
        pairs.join(info, on="rid")
        .sort(["op_id", "level"], descending=[False, True])
        .unique(subset="op_id", keep="first")
        .select(
            "op_id",
            pl.col("path").alias("projection_path"),
            pl.col("step").alias("projection_step"),
        )
    )
    at_start = (
        pieces.filter(pl.col("first_piece"))
        .select("op_id", "rid")
        .join(info, on="rid", how="left")
        .select(
            "op_id",
            pl.col("path").alias("window_path"),
            pl.col("step").alias("window_step_of_phase"),
        )
    )
    owners = (
        pieces.filter(pl.col("overlap_ns") > 0)
        .group_by("op_id")
        .agg((pl.col("rid").n_unique() > 1).alias("window_split"))
    )
    activity = (
        ops.join(innermost_proj, on="op_id", how="left")
        .join(at_start, on="op_id", how="left")
        .join(owners, on="op_id", how="left")
    )
    if steps.height:
        # the step window containing each start: a binary search over the (few, sorted) steps
        # instead of sorting a million operations for an as-of join
        windows = steps.sort("step_start_ns")
        index = (
            windows["step_start_ns"]
            .search_sorted(activity["start_ns"], side="right")
            .cast(pl.Int64)
            - 1
        )
        safe = index.clip(lower_bound=0)
        inside = (index >= 0) & (activity["start_ns"] < windows["step_end_ns"].gather(safe))
        activity = activity.with_columns(
            pl.when(pl.lit(inside)).then(pl.lit(windows["step"].gather(safe))).alias("step")
        )
    else:
        activity = activity.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    return activity.select(
        "op_id",
        "trace",
        "pid",
        pl.col("gtid").alias("launch_gtid"),
        "device",
        "stream",
        "kind",
        pl.col("op_class").cast(pl.String),
        "name",
        "start_ns",
        "end_ns",
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        "bytes",
        "correlation_id",
        "projection_step",
        "projection_path",
        pl.coalesce("window_step_of_phase", "step").alias("window_step"),
        "window_path",
        pl.col("window_split").fill_null(False),
    ).sort("op_id")
