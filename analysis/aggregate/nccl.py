"""NCCL time that matters: hidden by compute or exposed, and waiting for the last rank.

Pure functions of what an :class:`~analysis.model.Analysis` holds (the per-operation table
``gpu_activity``, the phase table and the phase ranges), so they also run on an analysis folder.

**Overlap** (:func:`nccl_overlap`), per phase row (trace, pid, step, path, attribution) and GPU:

- ``nccl_ns``: the union of the row's NCCL kernels on that GPU (NCCL kernels of several streams
  at once count once). *window*: every NCCL kernel of the GPU clipped to each of the row's
  ranges (as the phase table's ``nccl_ns``), summed over the ranges; *projection*: the NCCL
  kernels launched inside the row's ranges (whole operations, as the phase table's ``nccl_ns``:
  an asynchronous collective runs after its launching range has closed).
- ``overlapped_ns``: the part of that union during which a compute kernel (a non-NCCL kernel
  or a whole CUDA graph execution, of any process) ran on the same GPU;
  ``exposed_ns = nccl_ns − overlapped_ns``: NCCL ran and no compute did.

**Collectives** (:func:`nccl_collectives`): the same collective on each GPU, matched by kernel
name and order. Per attribution scheme, the NCCL kernels of each innermost phase (step, path)
are numbered per GPU and kernel name in start order (``seq``); kernels with the same (step,
path, name, seq) on different GPUs are one collective, if every GPU that ran that name in that
phase ran it equally often (else none of them is matched: ``unmatched_kernels``). Per GPU:
``wait_ns = last_arrival_ns − start_ns`` (the last GPU's start), ``transfer_ns = end_ns −
last_arrival_ns``; they add up to the kernel's duration. The ``straggler`` is the GPU that
arrived last (the earliest device name on a tie). A collective whose kernel ends on some GPU
before the last one started cannot be one collective: its wait and transfer are null
(``consistent`` false). nsys exports do not carry NCCL's communicator of a kernel (the NVTX
payload of NCCL's own ranges is not exported), so collectives of separate communicators with
the same kernel name in one phase (e.g. tensor-parallel groups) would be matched together.
"""

from __future__ import annotations

import polars as pl

from ..intervals import (
    covered_length,
    segment_boundaries,
    segments_inside,
    split_at_segments,
    union_blocks,
)
from ..model import PROJECTION, WINDOW

PATH_SEP = "/"
ROW = ["trace", "pid", "step", "path", "attribution"]

OVERLAP_SCHEMA: dict[str, pl.DataType] = {
    "trace": pl.String(),
    "pid": pl.Int64(),
    "step": pl.Int64(),
    "path": pl.String(),
    "attribution": pl.String(),
    "device": pl.String(),
    "nccl_ns": pl.Int64(),
    "exposed_ns": pl.Int64(),
    "overlapped_ns": pl.Int64(),
}
COLLECTIVE_SCHEMA: dict[str, pl.DataType] = {
    "attribution": pl.String(),
    "step": pl.Int64(),
    "path": pl.String(),
    "name": pl.String(),
    "seq": pl.Int64(),
    "n_ranks": pl.Int64(),
    "device": pl.String(),
    "trace": pl.String(),
    "pid": pl.Int64(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "last_arrival_ns": pl.Int64(),
    "wait_ns": pl.Int64(),
    "transfer_ns": pl.Int64(),
    "straggler": pl.String(),
    "consistent": pl.Boolean(),
}
SUMMARY_SCHEMA: dict[str, pl.DataType] = {
    "attribution": pl.String(),
    "step": pl.Int64(),
    "path": pl.String(),
    "n_collectives": pl.Int64(),
    "n_inconsistent": pl.Int64(),
    "unmatched_kernels": pl.Int64(),
    "wait_ns": pl.Int64(),
    "transfer_ns": pl.Int64(),
    "top_straggler": pl.String(),
    "top_straggler_count": pl.Int64(),
}
_NEEDED = ("device", "trace", "pid", "kind", "op_class", "name", "start_ns", "end_ns")
_SCHEME_COLUMNS = {
    PROJECTION: ("projection_step", "projection_path"),
    WINDOW: ("window_step", "window_path"),
}


def _usable(activity: pl.LazyFrame) -> bool:
    return all(c in activity.collect_schema().names() for c in _NEEDED)


def _nccl(activity: pl.LazyFrame) -> pl.LazyFrame:
    return activity.filter((pl.col("kind") == "kernel") & (pl.col("op_class") == "nccl"))


def _nccl_kernels(activity: pl.LazyFrame) -> tuple[list[str], pl.DataFrame] | None:
    """The activity's column names and its NCCL kernels; None without columns or kernels."""
    if not _usable(activity):
        return None
    nccl = _nccl(activity).collect(engine="streaming")
    if nccl.is_empty():
        return None
    return activity.collect_schema().names(), nccl


def nccl_overlap(
    activity: pl.LazyFrame,
    phases: pl.DataFrame,
    ranges: pl.DataFrame | None,
    pools: pl.DataFrame | None = None,
) -> pl.DataFrame | None:
    """Exposed vs overlapped NCCL time per phase row and GPU (:data:`OVERLAP_SCHEMA`).

    ``pools``: a run's GPU pools (``pools.csv``): a window range then holds the NCCL kernels
    of its own pool's GPUs only, as its phase row does.

    None when the run has no NCCL kernel, or the inputs cannot support the table (no
    operations; window rows without their ranges, as in a folder of an older version).
    Rows only where the phase had NCCL time on that GPU.
    """
    found = _nccl_kernels(activity)
    if found is None:
        return None
    names, nccl = found
    has_window = bool((phases["attribution"] == WINDOW).any())
    if has_window and ranges is None:
        return None
    blocks = []
    if "projection_path" in names and "projection_step" in names:
        blocks.append(_projection_blocks(nccl, phases))
    if has_window and ranges is not None:
        window = _window_blocks(nccl, ranges.filter(pl.col("attribution") == WINDOW))
        blocks.append(_on_own_pool(window, ranges, pools))
    if not blocks:
        return pl.DataFrame(schema=OVERLAP_SCHEMA)
    nccl_blocks = pl.concat(blocks, how="vertical")
    compute = activity.filter(
        pl.col("kind").is_in(("kernel", "graph")) & (pl.col("op_class") != "nccl")
    ).select("device", "start_ns", "end_ns")
    compute_blocks = union_blocks(compute.collect(engine="streaming"), ["device"])
    covered = covered_length(compute_blocks, nccl_blocks, ["device"])
    return (
        nccl_blocks.with_columns(
            (pl.col("end_ns") - pl.col("start_ns")).alias("nccl_ns"), covered.alias("overlapped_ns")
        )
        .group_by(*ROW, "device")
        .agg(pl.col("nccl_ns").sum(), pl.col("overlapped_ns").sum())
        .filter(pl.col("nccl_ns") > 0)
        .with_columns((pl.col("nccl_ns") - pl.col("overlapped_ns")).alias("exposed_ns"))
        .select([pl.col(c).cast(t) for c, t in OVERLAP_SCHEMA.items()])
        .sort(["step", "attribution", "trace", "pid", "path", "device"], nulls_last=True)
    )


def _projection_blocks(nccl: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """Disjoint NCCL busy blocks per (projection row, device): whole launched operations.

    An operation carries its innermost projection path; it also belongs to every enclosing
    path of its thread (the path's prefixes that are phases of the run), in the same step.
    """
    known = phases.filter(pl.col("attribution") == PROJECTION).select(
        "trace", "pid", "step", "path"
    )
    ops = nccl.filter(pl.col("projection_path").is_not_null()).select(
        "trace",
        "pid",
        pl.col("projection_step").alias("step"),
        pl.col("projection_path").alias("path"),
        "device",
        "start_ns",
        "end_ns",
    )
    if ops.is_empty() or known.is_empty():
        return pl.DataFrame(schema={**_ROW_SCHEMA, "device": pl.String, **_SPAN})
    enclosing = _with_enclosing(ops).join(
        known.unique(), on=["trace", "pid", "step", "path"], nulls_equal=True
    )
    return (
        union_blocks(enclosing, ["trace", "pid", "step", "path", "device"])
        .with_columns(pl.lit(PROJECTION).alias("attribution"))
        .select(*ROW, "device", "start_ns", "end_ns")
    )


_ROW_SCHEMA = {
    "trace": pl.String,
    "pid": pl.Int64,
    "step": pl.Int64,
    "path": pl.String,
    "attribution": pl.String,
}
_SPAN = {"start_ns": pl.Int64, "end_ns": pl.Int64}


def _with_enclosing(frame: pl.DataFrame) -> pl.DataFrame:
    """Each row once per prefix of its ``path`` (itself included)."""
    parts = pl.col("path").str.split(PATH_SEP)
    depth = int(frame.select(parts.list.len().max()).item())
    return pl.concat(
        [
            frame.filter(parts.list.len() > level).with_columns(
                parts.list.head(level + 1).list.join(PATH_SEP).alias("path")
            )
            for level in range(depth)
        ]
    )


def _on_own_pool(
    blocks: pl.DataFrame, ranges: pl.DataFrame, pools: pl.DataFrame | None
) -> pl.DataFrame:
    """Window blocks on their range's pool's GPUs only (all of them in a run without pools)."""
    if pools is None or "pool" not in ranges.columns:
        return blocks
    gpus = (
        pools.select("pool", pl.col("devices").str.split(",").alias("device"))
        .explode("device")
        .filter(pl.col("device").is_not_null() & (pl.col("device") != ""))
    )
    row_pool = ranges.filter(pl.col("attribution") == WINDOW).select(*ROW[:-1], "pool").unique()
    return (
        blocks.join(row_pool, on=list(ROW[:-1]), how="left", nulls_equal=True)
        .join(gpus, on=["pool", "device"], how="semi")
        .drop("pool")
    )


def _window_blocks(nccl: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Disjoint NCCL busy blocks per (window range, device), clipped to the range.

    The time line is cut at the ranges' ends into segments; each operation into its pieces per
    segment (:func:`~analysis.intervals.split_at_segments`), each piece joined to the ranges
    covering its segment, and the pieces of one (range, device) merged.
    """
    if ranges.is_empty():
        return pl.DataFrame(schema={**_ROW_SCHEMA, "device": pl.String, **_SPAN})
    bounds = segment_boundaries(ranges["start_ns"], ranges["end_ns"])
    covers = segments_inside(ranges, bounds, ["rid"]).select("rid", "seg")
    pieces = (
        split_at_segments(nccl.select("device", "start_ns", "end_ns"), bounds)
        .filter(pl.col("overlap_ns") > 0)
        .select(
            "device",
            "seg",
            pl.max_horizontal("start_ns", "seg_start_ns").alias("start_ns"),
            pl.min_horizontal("end_ns", "seg_end_ns").alias("end_ns"),
        )
        .join(covers, on="seg")
    )
    rows = ranges.select("rid", *ROW[:-1])
    return (
        union_blocks(pieces, ["rid", "device"])
        .join(rows, on="rid")
        .with_columns(pl.lit(WINDOW).alias("attribution"))
        .select(*ROW, "device", "start_ns", "end_ns")
    )


def nccl_collectives(activity: pl.LazyFrame, phases: pl.DataFrame) -> pl.DataFrame | None:
    """Collectives matched across GPUs, one row per (collective, GPU) (:data:`COLLECTIVE_SCHEMA`).

    None when the run has no NCCL kernel (or no operations to read).
    """
    kernels = _phase_kernels(activity, phases)
    if kernels is None:
        return None
    matched = kernels.filter(pl.col("matched"))
    collective = ["attribution", "step", "path", "name", "seq"]
    per = matched.with_columns(
        pl.col("start_ns").max().over(collective).alias("last_arrival_ns"),
        pl.len().over(collective).alias("n_ranks"),
    )
    straggler = (
        per.filter(pl.col("start_ns") == pl.col("last_arrival_ns"))
        .group_by(collective)
        .agg(pl.col("device").min().alias("straggler"))
    )
    consistent = (pl.col("end_ns") >= pl.col("last_arrival_ns")).all().over(collective)
    return (
        per.join(straggler, on=collective, nulls_equal=True)
        .with_columns(consistent.alias("consistent"))
        .with_columns(
            pl.when("consistent")
            .then(pl.col("last_arrival_ns") - pl.col("start_ns"))
            .alias("wait_ns"),
            pl.when("consistent")
            .then(pl.col("end_ns") - pl.col("last_arrival_ns"))
            .alias("transfer_ns"),
        )
        .select([pl.col(c).cast(t) for c, t in COLLECTIVE_SCHEMA.items()])
        .sort(["attribution", "step", "path", "last_arrival_ns", "name", "device"], nulls_last=True)
    )


def _phase_kernels(activity: pl.LazyFrame, phases: pl.DataFrame) -> pl.DataFrame | None:
    """The NCCL kernels of each scheme's innermost phases, numbered, with ``matched``."""
    found = _nccl_kernels(activity)
    if found is None:
        return None
    names, nccl = found
    parts = []
    for attribution, (step, path) in _SCHEME_COLUMNS.items():
        known = phases.filter(pl.col("attribution") == attribution)["path"].unique()
        if step not in names or path not in names or known.is_empty():
            continue
        parts.append(
            nccl.filter(pl.col(path).is_in(known.implode())).select(
                pl.lit(attribution).alias("attribution"),
                pl.col(step).alias("step"),
                pl.col(path).alias("path"),
                pl.col("name").cast(pl.String),
                "device",
                "trace",
                "pid",
                "start_ns",
                "end_ns",
            )
        )
    if not parts:
        return pl.DataFrame(schema={**_KERNEL_SCHEMA})
    kernels = pl.concat(parts, how="vertical").sort(
        "attribution", "step", "path", "name", "device", "start_ns", "end_ns", nulls_last=True
    )
    group = ["attribution", "step", "path", "name"]
    counts = pl.len().over([*group, "device"])
    return kernels.with_columns(
        pl.int_range(pl.len()).over([*group, "device"]).cast(pl.Int64).alias("seq"),
        (
            (counts.min().over(group) == counts.max().over(group))
            & (pl.col("device").n_unique().over(group) >= 2)
        ).alias("matched"),
    )


_KERNEL_SCHEMA = {
    "attribution": pl.String,
    "step": pl.Int64,
    "path": pl.String,
    "name": pl.String,
    "device": pl.String,
    "trace": pl.String,
    "pid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "seq": pl.Int64,
    "matched": pl.Boolean,
}


def nccl_collectives_by_phase(activity: pl.LazyFrame, phases: pl.DataFrame) -> pl.DataFrame | None:
    """Per innermost phase: collectives, total wait vs transfer, the most frequent straggler.

    :data:`SUMMARY_SCHEMA`; ``wait_ns``/``transfer_ns`` sum over the consistent collectives and
    their GPUs; ``unmatched_kernels``: NCCL kernels of the phase in no collective. None when
    the run has no NCCL kernel.
    """
    kernels = _phase_kernels(activity, phases)
    collectives = nccl_collectives(activity, phases)
    if kernels is None or collectives is None:
        return None
    phase = ["attribution", "step", "path"]
    one = collectives.unique([*phase, "name", "seq"], keep="first", maintain_order=True)
    counts = one.group_by(phase).agg(
        pl.len().cast(pl.Int64).alias("n_collectives"),
        (~pl.col("consistent")).sum().cast(pl.Int64).alias("n_inconsistent"),
    )
    stragglers = (
        one.filter(pl.col("consistent"))
        .group_by([*phase, "straggler"])
        .agg(pl.len().cast(pl.Int64).alias("top_straggler_count"))
        .sort([*phase, "top_straggler_count", "straggler"], descending=[False] * 3 + [True, False])
        .unique(phase, keep="first", maintain_order=True)
        .rename({"straggler": "top_straggler"})
    )
    # null, not 0, where no collective of the phase is consistent
    some = pl.col("consistent").any()
    times = collectives.group_by(phase).agg(
        pl.when(some).then(pl.col("wait_ns").sum()).alias("wait_ns"),
        pl.when(some).then(pl.col("transfer_ns").sum()).alias("transfer_ns"),
    )
    unmatched = kernels.group_by(phase).agg(
        (~pl.col("matched")).sum().cast(pl.Int64).alias("unmatched_kernels")
    )
    return (
        unmatched.join(counts, on=phase, how="left", nulls_equal=True)
        .join(times, on=phase, how="left", nulls_equal=True)
        .join(stragglers, on=phase, how="left", nulls_equal=True)
        .with_columns(pl.col("n_collectives").fill_null(0), pl.col("n_inconsistent").fill_null(0))
        .select([pl.col(c).cast(t) for c, t in SUMMARY_SCHEMA.items()])
        .sort(phase, nulls_last=True)
    )
