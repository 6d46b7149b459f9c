"""Attribute a whole run's GPU operations to its phase ranges, one time bucket at a time.

The pure core of ``analyze``: in-memory frames on one clock in, an :class:`Attributed` out. A run
comes as buckets of operations in time order (one bucket when it fits in memory); every
per-range figure is a sum, min, max or set over operations, except busy time (a union), which
:class:`~analysis.attribute.intervals.BusyAccumulator` carries across bucket edges, so any bucketing gives
the single-pass result.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ..aggregate import phases as aggregate
from ..aggregate.activity import gpu_activity
from ..aggregate.activity_writer import ACTIVITY_FILE, ActivityWriter
from ..aggregate.devices import phase_devices
from ..energy.attach import attach_energy
from ..energy.idle import busy_blocks, idle_guard_ns
from ..energy.samples import PowerData
from ..frames import concat_or_empty
from ..model import CUT, PROJECTION, WINDOW, EnergyTotals, GpuTotals
from ..normalize.events import OPS_SCHEMA
from ..normalize.launches import CALL_COLUMNS
from . import operations as attribute
from .conservation import RunTotals, conservation_warnings
from .intervals import BusyAccumulator
from .phase_map import PhaseMap
from .phase_ranges import phases_and_pools
from .pool_outputs import PoolInputs, pool_outputs, with_pool
from .process import ProcessLayout, ProcessSums
from .threads import ThreadSums

#: the columns of :attr:`Attributed.ranges` (and ``ranges.parquet``)
RANGE_COLUMNS = (
    "rid",
    "trace",
    "pid",
    "tid",
    "gtid",
    "name",
    "domain",
    "canonical",
    "path",
    "level",
    "step",
    "attribution",
    "start_ns",
    "end_ns",
    CUT,
)


@dataclass(frozen=True)
class Bucket:
    """The GPU operations (with ``op_id``, linked to launches) starting in ``[lo_ns, hi_ns)``."""

    lo_ns: int | None
    hi_ns: int | None
    ops: pl.DataFrame


@dataclass(frozen=True)
class Attributed:
    """:func:`attribute_buckets`' result: the tables and totals a :class:`RunSummary` starts from."""

    phases: pl.DataFrame
    phase_devices: pl.DataFrame
    gpu_activity: pl.LazyFrame
    kernels: pl.DataFrame
    steps: pl.DataFrame
    gpu: GpuTotals
    energy: EnergyTotals | None
    window_timeline: str
    n_phase_ranges: int
    n_devices: int
    warnings: list[str]
    power_samples: pl.DataFrame | None
    #: one row per phase range (``RANGE_COLUMNS``): what the timeline draws slice by slice
    ranges: pl.DataFrame
    #: one row per GPU pool with its GPU time balance (:func:`pool_balance`); None: no pools
    pools: pl.DataFrame | None = None
    #: idle GPU time per pool, step and cause (:mod:`analysis.attribute.idle_causes`); None: no pools
    idle_causes: pl.DataFrame | None = None

    def tables(self) -> dict[str, Any]:
        """The frames an :class:`~analysis.model.Analysis` takes as they are."""
        names = ("phases", "phase_devices", "gpu_activity", "kernels", "steps", "power_samples")
        return {name: getattr(self, name) for name in (*names, "ranges", "pools", "idle_causes")}


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
    thread_names: pl.DataFrame | None = None,
    capture_ends: Mapping[str, int] | None = None,
    pool_inputs: PoolInputs | None = None,
) -> Attributed:
    """Attribute a run's operations, bucket by bucket in time order, to its phase ranges.

    Per range, sums, min, max, sets and busy unions (carried across buckets by
    :class:`~analysis.attribute.intervals.BusyAccumulator`): any bucketing gives the one-pass
    result. ``activity_dir``: per-operation rows written there, not held; ``thread_names``:
    ``trace, gtid, thread_name``; ``capture_ends``: each file's capture end (by label);
    ``pool_inputs``: what tells the GPU pools (:mod:`analysis.attribute.pools`; None: one).
    """
    hierarchy, phases, pools = phases_and_pools(
        ranges, launch_threads, devices, phase_map, capture_ends or {}, pool_inputs
    )
    proj_ranges = phases.filter(pl.col("attribution") == PROJECTION)
    window_ranges = phases.filter(pl.col("attribution") == WINDOW)
    timeline = window_ranges if window_ranges.height else phases
    layouts = attribute.pool_layouts(timeline, pools)
    on_gpus = attribute.window_devices(layouts, devices)

    sums = _RunSums.over(devices, activity_dir, power, layouts, proj_ranges)
    for bucket in buckets:
        sums.add(bucket, proj_ranges, layouts, phases, hierarchy.steps)
    metrics, per_device, proj_devices, gpu, seg_dev = _range_metrics(
        sums, proj_ranges, window_ranges, layouts, on_gpus
    )
    energy = attach_energy(
        metrics,
        per_device,
        phases=phases,
        projection_devices=proj_devices,
        blocks=sums.blocks(),
        timeline=timeline,
        power=power,
        idle_power_w=idle_power_w,
        window_devices=on_gpus if pools.split else None,
        pools=[(t.ranges, t.devices) for t in layouts] if pools.split else None,
    )
    pooled = with_pool(phases, pools, layouts)
    table = aggregate.phase_table(pooled, energy.metrics)
    extra = pool_outputs(table, ranges, phases, pools, layouts, seg_dev, sums.totals, pool_inputs)
    return Attributed(
        phases=extra.phases,
        phase_devices=phase_devices(pooled, energy.per_device, devices, on_gpus),
        gpu_activity=sums.activity(),
        kernels=aggregate.kernel_table(sums.kernels or [aggregate.kernel_partial(_EMPTY_OPS)]),
        steps=hierarchy.steps,
        gpu=gpu,
        energy=energy.totals,
        window_timeline="driver" if window_ranges.height else "all",
        n_phase_ranges=phases.height,
        n_devices=len(devices),
        warnings=[
            *hierarchy.warnings,
            *launch_warnings,
            *energy.warnings,
            *sums.threads.warnings(ranges, proj_ranges, thread_names, gpu.total_gpu_ns),
            *conservation_warnings(gpu),
            *pools.warnings,
            *extra.warnings,
        ],
        power_samples=power.samples if power is not None else None,
        ranges=pooled.select(*RANGE_COLUMNS, *(["pool"] if pools.split else [])).sort("rid"),
        pools=extra.balance,
        idle_causes=extra.idle_causes,
    )


def _range_metrics(
    sums: _RunSums,
    proj_ranges: pl.DataFrame,
    window_ranges: pl.DataFrame,
    layouts: attribute.WindowLayout,
    on_gpus: pl.DataFrame,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, GpuTotals, pl.DataFrame]:
    """Per-range metrics of both schemes, per device, projection devices, totals, segment sums.

    The last: the per-(segment, device) window sums the rows come from, with each segment's
    innermost range. ``layouts``: each pool's window timeline; ``on_gpus``: the GPUs of each window range's pool.
    """
    proj_devices = concat_or_empty(
        sums.proj_devices, {"rid": pl.Int64, "device": pl.String}
    ).unique()
    proj_metrics = aggregate.merge_projection(
        sums.proj_sums or [_EMPTY_SUMS_RID], proj_devices, sums.proj_busy.result()
    ).filter(pl.col("rid").is_in(proj_ranges["rid"].implode()))
    seg_dev = aggregate.merge_segments(sums.seg_sums or [_EMPTY_SUMS_SEG], sums.seg_busy.result())
    per_device, win_metrics = aggregate.window_metrics(
        attribute.pooled_range_segments(window_ranges, layouts), seg_dev
    )
    n_devices = on_gpus.group_by("rid").agg(pl.len().cast(pl.Int64).alias("n_devices"))
    win_metrics = (
        window_ranges.select("rid")
        .join(win_metrics, on="rid", how="left")
        .join(n_devices, on="rid", how="left")
        .with_columns(pl.col("n_devices").fill_null(0))
    )
    process = sums.process.metrics(proj_ranges)
    metrics = pl.concat(
        [proj_metrics.join(process, on="rid", how="full", coalesce=True), win_metrics],
        how="diagonal_relaxed",
    )
    # the check's attributed sides: the sums the rows are built from (innermost window phase
    # of each segment; top-level projection ranges), against totals from the raw operations
    innermost = attribute.pooled_innermost(layouts)
    gpu = sums.totals.totals(
        innermost_sums=seg_dev.join(innermost.filter(pl.col("rid").is_not_null()), on="seg"),
        top_sums=proj_metrics.join(
            proj_ranges.filter(pl.col("level") == 0).select("rid"), on="rid"
        ),
    )
    return metrics, per_device, proj_devices, gpu, seg_dev.join(innermost, on="seg", how="left")


class _RunSums:
    """What :func:`attribute_buckets` keeps of each bucket.

    Partial sums, busy accumulators, the per-operation rows (in memory or written out), the
    run's totals (:class:`RunTotals`), each process's work inside its projection ranges
    (:class:`ProcessSums`) and each launching thread's work (:class:`ThreadSums`).
    """

    @classmethod
    def over(
        cls,
        devices: list[str],
        activity_dir: Path | None,
        power: PowerData | None,
        layouts: attribute.WindowLayout,
        proj_ranges: pl.DataFrame,
    ) -> _RunSums:
        """Empty sums over these pools' window timelines and projection ranges."""
        return cls(
            devices,
            activity_dir,
            power,
            RunTotals(layouts, proj_ranges),
            ProcessSums(ProcessLayout.of(proj_ranges), devices),
            attribute.enclosure_layout(proj_ranges),
        )

    def __init__(
        self,
        devices: list[str],
        activity_dir: Path | None,
        power: PowerData | None,
        totals: RunTotals,
        process: ProcessSums,
        enclosure: attribute.EnclosureLayout,
    ) -> None:
        self.proj_sums: list[pl.DataFrame] = []
        self.proj_devices: list[pl.DataFrame] = []
        self.proj_busy = BusyAccumulator({"rid": pl.Int64, "device": pl.String}, devices=devices)
        self.seg_sums: list[pl.DataFrame] = []
        self.seg_busy = BusyAccumulator({"seg": pl.Int64, "device": pl.String}, devices=devices)
        self.kernels: list[pl.DataFrame] = []
        self.activity_dir = activity_dir
        self.activity_parts: list[pl.DataFrame] = []
        self.activity_files: list[Path] = []
        self._writer: ActivityWriter | None = None
        self._blocks: list[pl.DataFrame] = []
        self._merge_gap_ns = 2 * idle_guard_ns(power.interval_ns) if power is not None else None
        self.totals = totals
        self.process = process
        self.enclosure = enclosure
        self.threads = ThreadSums()

    def add(
        self,
        bucket: Bucket,
        proj_ranges: pl.DataFrame,
        layouts: attribute.WindowLayout,
        phases: pl.DataFrame,
        steps: pl.DataFrame,
    ) -> None:
        """Attribute one bucket's operations and keep what the run needs of them."""
        ops = bucket.ops
        pairs = attribute.projection_pairs(ops, proj_ranges, self.enclosure)
        proj_sums, proj_devices, proj_busy = aggregate.projection_partials(pairs, ops, proj_ranges)
        self.proj_sums.append(proj_sums)
        self.proj_devices.append(proj_devices)
        self.proj_busy.add(proj_busy, bucket.hi_ns)
        pieces = attribute.pooled_pieces(ops, layouts)
        seg_sums, seg_busy = aggregate.segment_partials(pieces)
        self.seg_sums.append(seg_sums)
        self.seg_busy.add(seg_busy, bucket.hi_ns)
        self.kernels.append(aggregate.kernel_partial(ops))
        if self._merge_gap_ns is not None:
            self._blocks.append(busy_blocks(ops, merge_gap_ns=self._merge_gap_ns))
        self.totals.add(ops, pairs)
        self.process.add(ops, bucket.hi_ns)
        self.threads.add(ops)
        activity = gpu_activity(ops, pairs, pieces, phases, steps)
        if self.activity_dir is None:
            self.activity_parts.append(activity)
        else:
            self._write_activity(activity)

    def _write_activity(self, activity: pl.DataFrame) -> None:
        """Append one bucket's rows to the run's activity file (one Parquet file, row groups).

        One file, not a part per bucket: ``write_outputs`` then copies it as
        ``gpu_activity.parquet`` instead of reading and re-encoding every part.
        """
        assert self.activity_dir is not None
        if self._writer is None:
            self.activity_dir.mkdir(exist_ok=True)
            self._writer = ActivityWriter(self.activity_dir / ACTIVITY_FILE)
            self.activity_files.append(self._writer.path)
        self._writer.write(activity)

    def blocks(self) -> pl.DataFrame:
        """Busy stretches per device over the whole run (for the idle power baseline)."""
        frames = self._blocks or [pl.DataFrame(schema={k: OPS_SCHEMA[k] for k in _BLOCK})]
        return busy_blocks(pl.concat(frames), merge_gap_ns=self._merge_gap_ns or 0)

    def activity(self) -> pl.LazyFrame:
        """Every operation's row: in memory, or a lazy scan of the parts written per bucket."""
        if self._writer is not None:
            self._writer.close()  # idempotent
            return pl.scan_parquet(self._writer.path)
        if self.activity_parts:
            return pl.concat(self.activity_parts).lazy()
        return gpu_activity(
            _EMPTY_OPS,
            pl.DataFrame(schema={"op_id": pl.Int64, "rid": pl.Int64}),
            attribute.window_pieces(_EMPTY_OPS, pl.Series([], dtype=pl.Int64), _EMPTY_INNERMOST),
            pl.DataFrame(
                schema={"rid": pl.Int64, "path": pl.String, "step": pl.Int64, "level": pl.Int32}
            ),
            pl.DataFrame(),
        ).lazy()


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
