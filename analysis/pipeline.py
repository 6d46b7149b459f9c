"""``analyze``: export files → phase table, GPU activity, kernel table and summary.

Read and normalize each file (map), put all files on one clock, then build the hierarchy and
attribute over the whole run (reduce): the window scheme needs every process's ranges at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analysis import aggregate, attribute, energy
from analysis.align import clock_offsets
from analysis.hierarchy import build_hierarchy
from analysis.loading import Engine, load_all, shift
from analysis.normalize import MARKS_SCHEMA, OPS_SCHEMA, RANGES_SCHEMA, RUNTIME_SCHEMA
from analysis.phase_map import PhaseMap, default_phase_map
from analysis.power import PowerData, align, load_samples

PROJECTION = "projection"
WINDOW = "window"


@dataclass
class Analysis:
    """Everything ``analyze`` computes; frames are ready to write."""

    phases: pl.DataFrame
    phase_devices: pl.DataFrame
    gpu_activity: pl.DataFrame
    kernels: pl.DataFrame
    steps: pl.DataFrame
    summary: dict
    warnings: list[str] = field(default_factory=list)
    #: Power samples on the run's clock (``device, t_ns, power_w, energy_mj``), if any.
    power_samples: pl.DataFrame | None = None


def _concat(frames: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
    frames = [f for f in frames if f.height]
    return pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=schema)


def find_power_files(paths: Sequence[Path]) -> list[Path]:
    """Sampler Parquet files that belong to these traces.

    Those are ``<stem>.power.parquet`` beside a trace, and ``power_*.parquet`` in a trace's
    folder (where ``nvtx-phases profile`` puts them).
    """
    found: list[Path] = []
    for path in paths:
        for candidate in (
            path.with_name(path.stem + ".power.parquet"),
            *sorted(path.parent.glob("power_*.parquet")),
        ):
            if candidate.exists() and candidate not in found:
                found.append(candidate)
    return found


def analyze(
    paths: Sequence[str | Path],
    *,
    phase_map: PhaseMap | None = None,
    power_files: Sequence[str | Path] | None = None,
    idle_power_w: float | None = None,
    progress: Callable[[str], None] | None = None,
    jobs: int = 1,
    engine: Engine = "process",
    on_file_done: Callable[[str], None] | None = None,
) -> Analysis:
    """Analyze one run given as one or more nsys SQLite exports (one per process or node).

    ``power_files``: NVML sampler Parquet files; by default those found beside the traces
    (:func:`find_power_files`); pass ``[]`` for none. ``jobs``/``engine``: read files in a
    process pool or as Ray tasks (:mod:`analysis.loading`); the result does not depend on them.
    """
    phase_map = phase_map or default_phase_map()
    paths = [Path(p) for p in paths]
    labels = _unique_labels(paths)
    if progress:
        progress(f"reading {len(paths)} export(s)")
    loaded = load_all(paths, labels, jobs=jobs, engine=engine, on_done=on_file_done)
    offsets, warnings = clock_offsets(loaded)
    ranges, ops, runtime, marks = [], [], [], []
    for trace in loaded:
        warnings.extend(trace.warnings)
        norm = shift(trace.norm, offsets[trace.label])
        ranges.append(norm.ranges)
        ops.append(norm.ops)
        runtime.append(norm.runtime)
        marks.append(norm.marks)
    if progress:
        progress("attributing")
    all_ranges = _concat(ranges, RANGES_SCHEMA)
    all_ops = (
        _concat(ops, OPS_SCHEMA)
        .with_row_index("op_id")
        .with_columns(pl.col("op_id").cast(pl.Int64))
    )
    all_runtime = _concat(runtime, RUNTIME_SCHEMA)
    power_paths = (
        [Path(p) for p in power_files] if power_files is not None else find_power_files(paths)
    )
    power = None
    if power_paths:
        if progress:
            progress("aligning power samples")
        known = [t.session_start_utc_ns for t in loaded if t.session_start_utc_ns is not None]
        power = align(
            load_samples(power_paths),
            _concat(marks, MARKS_SCHEMA),
            origin_utc_ns=min(known) if known else None,
            op_devices=all_ops["device"].unique().to_list(),
        )
        warnings.extend(power.warnings)
    result = attribute_run(
        all_ranges, all_ops, all_runtime, phase_map, power=power, idle_power_w=idle_power_w
    )
    result.warnings[:0] = warnings
    result.summary.update(
        gpus=sorted({name for t in loaded for name in t.gpus}),
        driver_versions=sorted({t.driver_version for t in loaded if t.driver_version}),
        traces=[
            {
                "label": t.label,
                "path": str(t.path),
                "nsys_version": t.nsys_version,
                "host": t.host,
                "session_start_utc_ns": t.session_start_utc_ns,
                "clock_offset_ns": offsets[t.label],
                "missing_tables": t.missing_tables,
            }
            for t in loaded
        ],
        missing_tables=sorted({m for t in loaded for m in t.missing_tables}),
        n_ranges=all_ranges.height,
        power_files=[str(p) for p in power_paths],
        warnings=result.warnings,
    )
    return result


def attribute_run(
    ranges: pl.DataFrame,
    ops: pl.DataFrame,
    runtime: pl.DataFrame,
    phase_map: PhaseMap,
    *,
    power: PowerData | None = None,
    idle_power_w: float | None = None,
) -> Analysis:
    """The pure core: tidy frames of a whole run (one clock) → :class:`Analysis`."""
    hierarchy = build_hierarchy(ranges, phase_map)
    phases = hierarchy.phases
    warnings = list(hierarchy.warnings)
    launches = attribute.link_launches(ops, runtime)
    warnings.extend(launches.warnings)
    ops = launches.ops

    on_launch_thread = phases.join(
        launches.launch_threads.with_columns(pl.lit(True).alias("launches")),
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

    # projection
    pairs = attribute.projection_pairs(ops, proj_ranges)
    proj_metrics = aggregate.projection_metrics(pairs, ops, phases)

    # window
    pieces, boundaries, innermost = attribute.window_pieces(ops, timeline)
    seg_dev = aggregate.segment_device_metrics(pieces)
    n_devices = ops["device"].n_unique()
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
        range_energy, device_energy, idle = energy.phase_energy(
            phases, pairs, ops, power, idle_power_w=idle_power_w
        )
        metrics = metrics.join(range_energy, on="rid", how="full", coalesce=True)
        per_device = per_device.join(device_energy, on=["rid", "device"], how="full", coalesce=True)
        energy_summary = {
            **energy.energy_conservation(power, boundaries, innermost),
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
    devices = _phase_devices(phases, per_device, ops)
    activity = _gpu_activity(ops, pairs, pieces, phases, hierarchy.steps)
    total = int((ops["end_ns"] - ops["start_ns"]).sum()) if ops.height else 0
    window_attr = int(pieces.filter(pl.col("rid").is_not_null())["overlap_ns"].sum())
    proj_attr = int(activity.filter(pl.col("projection_path").is_not_null())["dur_ns"].sum())
    summary = {
        "total_gpu_ns": total,
        "attributed_gpu_ns": window_attr,
        "unattributed_gpu_ns": total - window_attr,
        "projection_attributed_gpu_ns": proj_attr,
        "projection_unattributed_gpu_ns": total - proj_attr,
        "window_timeline": timeline_source,
        "n_phase_ranges": phases.height,
        "n_gpu_ops": ops.height,
        "n_kernels": int((ops["kind"] == "kernel").sum()),
        "n_devices": n_devices,
        "n_steps": hierarchy.steps.height,
        "kernel_ns": int(activity.filter(pl.col("kind") == "kernel")["dur_ns"].sum()),
        "nccl_ns": int(activity.filter(pl.col("op_class") == "nccl")["dur_ns"].sum()),
        "memcpy_ns": int(activity.filter(pl.col("kind") == "memcpy")["dur_ns"].sum()),
        "memcpy_bytes": int(activity.filter(pl.col("kind") == "memcpy")["bytes"].sum()),
        "memset_ns": int(activity.filter(pl.col("kind") == "memset")["dur_ns"].sum()),
        **energy_summary,
    }
    return Analysis(
        phases=table,
        phase_devices=devices,
        gpu_activity=activity,
        kernels=aggregate.kernel_table(ops),
        steps=hierarchy.steps,
        summary=summary,
        warnings=warnings,
        power_samples=power.samples if power is not None else None,
    )


def _phase_devices(
    phases: pl.DataFrame, per_device: pl.DataFrame, ops: pl.DataFrame
) -> pl.DataFrame:
    """Window phases per device: where each rank's GPU was busy or idle during a driver phase."""
    keys = ["trace", "pid", "step", "path", "phase"]
    window = phases.filter(pl.col("attribution") == WINDOW).select(
        "rid",
        *[k for k in keys if k != "phase"],
        pl.col("name").alias("phase"),
        (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"),
    )
    devices = pl.concat([ops.select("device"), per_device.select("device")]).unique()
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
        .sort(["step", "path", "device"], nulls_last=True)
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


def _unique_labels(paths: list[Path]) -> list[str]:
    """File stems, made unique with the parent folder name where two files share a stem."""
    stems = [p.stem for p in paths]
    return [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
