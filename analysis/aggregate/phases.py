"""Per-range metrics under each attribution scheme → the phase table, kernel table and totals.

Definitions (also in the README):
- ``kernel_ns`` all kernels (NCCL included), ``nccl_ns`` NCCL kernels, ``memcpy_ns``/``memset_ns``
  copies and sets, ``graph_ns`` whole CUDA graph executions (captured with
  ``--cuda-graph-trace=graph``, whose kernels nsys does not list); under *projection* whole
  operations, under *window* the part inside the range.
- ``gpu_busy_ns``: per device, the union of the range's operations within the range's interval
  (overlapping streams count once), summed over the devices concerned.
- ``idle_ns = wall_ns × n_devices − gpu_busy_ns``; devices concerned are those the range's
  operations ran on (projection) or every device of the run (window).
- ``n_kernels``/``n_graphs``: the operations whose time the row holds. *window*: every
  operation that runs inside the range (overlap > 0), so a kernel straddling a phase boundary
  is counted in both phases, as its time is split between them; a zero-length operation counts
  where its instant lies. *projection*: every operation launched inside the range (whole).
- ``n_kernels_started``/``n_graphs_started``: each operation counted once, where it starts
  (window: the range holding its start; projection: the same as ``n_kernels``/``n_graphs``).
  Sums over the ranges of one level (that do not overlap) equal the run's count; use these to
  add counts up.
- ``memcpy_bytes``: bytes of the copies that start inside the range (window; a copy's bytes
  are not split) or are launched inside it (projection).
- ``process_*`` (projection rows only, null on window rows): the GPU work of the range's whole
  process inside its interval, every thread (see :mod:`analysis.attribute.process`).
- ``cut_at_capture_end``: a range of the row ends exactly at the end of its file's capture
  (:func:`analysis.attribute.phase_ranges.mark_cut`): its wall time is not the range's own.
"""

from __future__ import annotations

import polars as pl

from ..model import CUT, PROJECTION

#: the phase-table columns :mod:`analysis.attribute.process` fills (null on window rows)
PROCESS_COLUMNS = (
    "process_gpu_ns",
    "process_gpu_busy_ns",
    "process_idle_ns",
    "process_n_devices",
)

GROUP_KEYS = ["trace", "pid", "step", "path", "phase", "attribution"]
#: Per-operation sums every range carries (the phase table also has busy, idle and wall time).
SUMMED_METRICS = [
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "graph_ns",
    "n_kernels",
    "n_graphs",
    "n_kernels_started",
    "n_graphs_started",
]
#: Per-(segment, device) counts of window pieces that continue an operation begun in an earlier
#: segment: a range's ``n_kernels`` adds those of its first segment to the starts inside it.
CONTINUED = {"n_kernels": "n_kernels_continued", "n_graphs": "n_graphs_continued"}


#: the phase table's columns, in order
PHASE_TABLE_COLUMNS = (
    *("trace", "pid", "step", "phase", "path", "canonical", "domain", "level", "attribution"),
    *("n_ranges", "start_ns", "end_ns", "wall_ns", "gpu_busy_ns", "idle_ns"),
    *SUMMED_METRICS,
    *("n_devices", "gpu_start_ns", "gpu_end_ns"),
    *PROCESS_COLUMNS,
    *("energy_j", "avg_power_w", "peak_power_w", "energy_above_idle_j", "gap_energy_j"),
    *("energy_samples", "below_sampling_interval", CUT),
)


def sum_or_null(name: str) -> pl.Expr:
    """Sum of a column, null (not 0) when every value is null: absent data is not zero."""
    return pl.when(pl.col(name).is_not_null().any()).then(pl.col(name).sum()).alias(name)


def class_sums(duration: pl.Expr, started: pl.Expr) -> list[pl.Expr]:
    """Per-class time sums of ``duration``; bytes and ``n_*_started`` of rows where ``started``."""
    kind = pl.col("kind")
    return [
        duration.filter(kind == "kernel").sum().alias("kernel_ns"),
        duration.filter(pl.col("op_class") == "nccl").sum().alias("nccl_ns"),
        duration.filter(kind == "memcpy").sum().alias("memcpy_ns"),
        pl.col("bytes").filter((kind == "memcpy") & started).sum().alias("memcpy_bytes"),
        duration.filter(kind == "memset").sum().alias("memset_ns"),
        duration.filter(kind == "graph").sum().alias("graph_ns"),
        ((kind == "kernel") & started).sum().cast(pl.Int64).alias("n_kernels_started"),
        ((kind == "graph") & started).sum().cast(pl.Int64).alias("n_graphs_started"),
    ]


def projection_partials(
    pairs: pl.DataFrame, ops: pl.DataFrame, ranges: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """One bucket's projection: sums per range, (rid, device) seen, and busy intervals.

    Sums count whole operations (each operation is in one bucket, where it starts); the busy
    intervals are the operations clipped to their range, for :class:`BusyAccumulator`.
    """
    joined = pairs.join(
        ops.select("op_id", "device", "kind", "op_class", "bytes", "start_ns", "end_ns"),
        on="op_id",
    ).join(
        ranges.select("rid", pl.col("start_ns").alias("r_start"), pl.col("end_ns").alias("r_end")),
        on="rid",
    )
    sums = joined.group_by("rid").agg(
        *class_sums(pl.col("end_ns") - pl.col("start_ns"), pl.lit(True)),
        pl.col("start_ns").min().alias("gpu_start_ns"),
        pl.col("end_ns").max().alias("gpu_end_ns"),
    )
    # whole operations: every one the range holds was launched (started) inside it
    sums = sums.with_columns(pl.col(f"{count}_started").alias(count) for count in CONTINUED).select(
        "rid", *SUMMED_METRICS, "gpu_start_ns", "gpu_end_ns"
    )
    devices = joined.select("rid", "device").unique()
    clipped = joined.select(
        "rid",
        "device",
        pl.max_horizontal("start_ns", "r_start").alias("start_ns"),
        pl.min_horizontal("end_ns", "r_end").alias("end_ns"),
    ).filter(pl.col("end_ns") > pl.col("start_ns"))
    return sums, devices, clipped


def merge_projection(
    sums: list[pl.DataFrame], devices: pl.DataFrame, busy: pl.DataFrame
) -> pl.DataFrame:
    """Projection metrics per range from the buckets' partials (see :func:`projection_partials`)."""
    merged = _merge_sums(sums, "rid")
    n_devices = devices.group_by("rid").agg(pl.len().cast(pl.UInt32).alias("n_devices"))
    busy = busy.group_by("rid").agg(pl.col("busy_ns").sum().alias("gpu_busy_ns"))
    return (
        merged.join(n_devices, on="rid", how="left")
        .join(busy, on="rid", how="left")
        .with_columns(pl.col("gpu_busy_ns").fill_null(0))
    )


def segment_partials(pieces: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One bucket's window pieces: clipped class sums per (segment, device), busy intervals.

    Counts per segment: ``n_*_started`` the operations starting in it (their first piece),
    ``n_*_continued`` those running on from an earlier segment (see :func:`window_metrics`).
    """
    kind, continued = pl.col("kind"), (pl.col("overlap_ns") > 0) & ~pl.col("first_piece")
    sums = pieces.group_by("seg", "device").agg(
        *class_sums(pl.col("overlap_ns"), pl.col("first_piece")),
        ((kind == "kernel") & continued).sum().cast(pl.Int64).alias(CONTINUED["n_kernels"]),
        ((kind == "graph") & continued).sum().cast(pl.Int64).alias(CONTINUED["n_graphs"]),
        pl.col("piece_start_ns").filter(pl.col("overlap_ns") > 0).min().alias("gpu_start_ns"),
        pl.col("piece_end_ns").filter(pl.col("overlap_ns") > 0).max().alias("gpu_end_ns"),
    )
    busy = pieces.filter(pl.col("overlap_ns") > 0).select(
        "seg",
        "device",
        pl.col("piece_start_ns").alias("start_ns"),
        pl.col("piece_end_ns").alias("end_ns"),
    )
    return sums, busy


def merge_segments(sums: list[pl.DataFrame], busy: pl.DataFrame) -> pl.DataFrame:
    """Per (segment, device): sums, counts, busy union and first/last activity, all buckets."""
    return (
        _merge_sums(sums, ["seg", "device"])
        .join(busy, on=["seg", "device"], how="left")
        .with_columns(pl.col("busy_ns").fill_null(0).alias("gpu_busy_ns"))
        .drop("busy_ns")
    )


def _merge_sums(parts: list[pl.DataFrame], keys: str | list[str]) -> pl.DataFrame:
    frame = pl.concat(parts)
    if len(parts) == 1:
        return frame
    summed = [m for m in (*SUMMED_METRICS, *CONTINUED.values()) if m in frame.columns]
    return frame.group_by(keys).agg(
        *(pl.col(m).sum() for m in summed),
        pl.col("gpu_start_ns").min(),
        pl.col("gpu_end_ns").max(),
    )


def window_metrics(
    range_segs: pl.DataFrame, seg_dev: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Metrics per (range, device) and per range, summing the segments inside each range.

    ``range_segs``: ``rid, seg, first_seg`` (:func:`analysis.attribute.operations.range_segments`).
    An operation holding time in a range starts in one of its segments or runs into its first
    one, so ``n_kernels`` adds the starts in every segment to the continuations into the first:
    each such operation once, however many of the range's segments it spans.
    """
    own = [m for m in SUMMED_METRICS if m not in CONTINUED]
    summed = [pl.col(m).sum() for m in (*own, "gpu_busy_ns")]
    holding = [
        (pl.col(f"{count}_started").sum() + pl.col(cont).filter(pl.col("first_seg")).sum()).alias(
            count
        )
        for count, cont in CONTINUED.items()
    ]
    per_device = (
        range_segs.join(seg_dev, on="seg", how="inner")
        .group_by("rid", "device")
        .agg(*summed, *holding, pl.col("gpu_start_ns").min(), pl.col("gpu_end_ns").max())
    )
    summed = [pl.col(m).sum() for m in (*SUMMED_METRICS, "gpu_busy_ns")]
    per_range = per_device.group_by("rid").agg(
        *summed, pl.col("gpu_start_ns").min(), pl.col("gpu_end_ns").max()
    )
    return per_device, per_range


def phase_table(phases: pl.DataFrame, metrics: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace, pid, step, path, phase, attribution), instances of a path summed.

    ``phases`` with a ``pool`` column (a run with GPU pools): the table ends with it.
    """
    pooled = ["pool"] if "pool" in phases.columns else []
    if CUT not in phases.columns:  # ranges not marked (no capture end known): none is cut
        phases = phases.with_columns(pl.lit(False).alias(CUT))
    rows = (
        phases.join(metrics, on="rid", how="left")
        .with_columns(
            [pl.col(m).fill_null(0) for m in (*SUMMED_METRICS, "gpu_busy_ns", "n_devices")]
        )
        .with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"),
            pl.col("name").alias("phase"),
        )
        .with_columns(
            (pl.col("wall_ns") * pl.col("n_devices") - pl.col("gpu_busy_ns")).alias("idle_ns"),
            *_process_columns(),
        )
    )
    table = (
        rows.sort("rid")
        .group_by(GROUP_KEYS)  # sorted: float sums in a fixed order
        .agg(
            pl.col("canonical").first(),
            pl.col("domain").first(),
            pl.col("level").min(),
            pl.len().cast(pl.Int64).alias("n_ranges"),
            pl.col("start_ns").min(),
            pl.col("end_ns").max(),
            pl.col("wall_ns").sum(),
            pl.col("gpu_busy_ns").sum(),
            pl.col("idle_ns").sum(),
            *(pl.col(m).sum() for m in SUMMED_METRICS),
            pl.col("n_devices").max(),
            pl.col("gpu_start_ns").min(),
            pl.col("gpu_end_ns").max(),
            # process_*: null on window rows
            sum_or_null("process_gpu_ns"),
            sum_or_null("process_gpu_busy_ns"),
            sum_or_null("process_idle_ns"),
            pl.col("process_n_devices").max(),
            # energy: null (not zero) when there were no power samples
            sum_or_null("energy_j"),
            sum_or_null("energy_above_idle_j"),
            sum_or_null("gap_energy_j"),
            pl.col("peak_power_w").max(),
            pl.col("energy_samples").min(),
            pl.when(pl.col("below_sampling_interval").is_not_null().any())
            .then(pl.col("below_sampling_interval").any(ignore_nulls=True))
            .alias("below_sampling_interval"),
            pl.col(CUT).any(),
            *(pl.col(c).first() for c in pooled),
        )
        .with_columns((pl.col("energy_j") / (pl.col("wall_ns") / 1e9)).alias("avg_power_w"))
        .sort(
            ["step", "start_ns", "level", "trace", "pid", "path", "phase", "attribution"],
            nulls_last=True,
        )
    )
    return table.select(*PHASE_TABLE_COLUMNS, *pooled)


def _process_columns() -> list[pl.Expr]:
    """``process_*`` of one range row: 0-filled on projection rows, null on window rows."""
    projection = pl.col("attribution") == PROJECTION
    n_devices = pl.col("process_n_devices").fill_null(0)
    busy = pl.col("process_gpu_busy_ns").fill_null(0)
    return [
        pl.when(projection).then(pl.col("process_gpu_ns").fill_null(0)).alias("process_gpu_ns"),
        pl.when(projection).then(busy).alias("process_gpu_busy_ns"),
        pl.when(projection).then(pl.col("wall_ns") * n_devices - busy).alias("process_idle_ns"),
        pl.when(projection).then(n_devices).alias("process_n_devices"),
    ]


def kernel_partial(ops: pl.DataFrame) -> pl.DataFrame:
    """Per kernel name (and CUDA graph) in one bucket: count, total, min and max duration."""
    dur = pl.col("end_ns") - pl.col("start_ns")
    return (
        ops.filter(pl.col("kind").is_in(["kernel", "graph"]))
        .group_by("name", "op_class")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            dur.sum().alias("total_ns"),
            dur.min().alias("min_ns"),
            dur.max().alias("max_ns"),
        )
    )


def kernel_table(partials: list[pl.DataFrame]) -> pl.DataFrame:
    """Per kernel name: count and time (comparable with ``nsys stats -r gpukernsum``)."""
    return (
        pl.concat(partials)
        .group_by("name", "op_class")
        .agg(
            pl.col("count").sum(),
            pl.col("total_ns").sum(),
            pl.col("min_ns").min(),
            pl.col("max_ns").max(),
        )
        .select(
            "name",
            "op_class",
            "count",
            "total_ns",
            (pl.col("total_ns") / pl.col("count")).alias("avg_ns"),
            "min_ns",
            "max_ns",
        )
        .sort(["total_ns", "name"], descending=[True, False])
    )
