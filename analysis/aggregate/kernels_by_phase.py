"""Top kernels per phase: GPU time per kernel name inside each phase, under each scheme.

Pure: the per-operation table (``gpu_activity``, lazy: it may hold millions of rows) and the
phase table in, one frame out, one row per (attribution, scope, step, phase path, kernel name)
for the ``top`` names with the most time in that phase.

- *projection* (as ``nsys stats -r nvtxkernsum``): whole operations, in the innermost phase
  enclosing their launch and in every enclosing phase of the same thread (the path's prefixes).
- *window*: every operation on every device, clipped to the phase's interval (an operation
  straddling a boundary counts only its overlap); a phase includes its children's time. The
  interval is the union, over the processes that mark the phase in that step, of each one's
  span from the phase's first start to its last end (the phase table's ``start_ns``/``end_ns``).

Kernels include NCCL kernels and whole CUDA graph executions (class ``cuda_graph``), as in
``kernels.csv``; memcpy and memset are not kernels. ``scope`` is ``step`` (one step; ``step``
null for phases outside any step) or ``all`` (every step, and phases outside steps: ``step``
null). ``count`` is the number of operations with time in the phase; ``mean_ns = total_ns /
count``; ``share_pct`` is the name's share of ``phase_kernel_ns``, the phase's time over every
kernel name (not only the top ones).
"""

from __future__ import annotations

import polars as pl

from ..intervals import (
    last_segment_of,
    segment_boundaries,
    segment_of,
    segments_inside,
    union_blocks,
)
from ..model import PROJECTION, WINDOW

DEFAULT_TOP = 10
#: operation kinds counted as kernels (CUDA graph executions are launched like kernels)
KERNEL_KINDS = ("kernel", "graph")
ACTIVITY_COLUMNS = ("kind", "op_class", "name", "start_ns", "end_ns")
PATH_SEP = "/"

SCHEMA: dict[str, pl.DataType] = {
    "attribution": pl.String(),
    "scope": pl.String(),
    "step": pl.Int64(),
    "path": pl.String(),
    "rank": pl.Int64(),
    "name": pl.String(),
    "op_class": pl.String(),
    "count": pl.Int64(),
    "total_ns": pl.Int64(),
    "mean_ns": pl.Float64(),
    "share_pct": pl.Float64(),
    "phase_kernel_ns": pl.Int64(),
}
#: one phase's time per kernel name, before ranking
_SUMS: dict[str, pl.DataType] = {
    "step": pl.Int64(),
    "path": pl.String(),
    "name": pl.String(),
    "op_class": pl.String(),
    "count": pl.Int64(),
    "total_ns": pl.Int64(),
}
_KEYS = ["step", "path", "name", "op_class"]


def kernels_by_phase(
    activity: pl.LazyFrame,
    phases: pl.DataFrame,
    *,
    top: int | None = DEFAULT_TOP,
) -> pl.DataFrame:
    """The ``top`` kernel names by GPU time per (attribution, scope, step, phase path).

    ``top`` None or 0: every name. ``activity`` is read in streaming passes (one for the
    projection, two for the window scheme); only operations crossing a window phase's
    boundary are held in memory.
    """
    names = activity.collect_schema().names()
    if any(c not in names for c in ACTIVITY_COLUMNS) or not phases.height:
        return pl.DataFrame(schema=SCHEMA)
    kernels = activity.filter(pl.col("kind").is_in(KERNEL_KINDS))
    parts = []
    if "projection_path" in names and "projection_step" in names:
        projected = _projection_sums(kernels, _paths(phases, PROJECTION))
        parts.append(projected.with_columns(pl.lit(PROJECTION).alias("attribution")))
    clipped = _window_sums(kernels, phases.filter(pl.col("attribution") == WINDOW))
    parts.append(clipped.with_columns(pl.lit(WINDOW).alias("attribution")))
    return _ranked(pl.concat(parts, how="vertical"), top)


def _paths(phases: pl.DataFrame, attribution: str) -> pl.Series:
    return phases.filter(pl.col("attribution") == attribution)["path"].unique()


def _projection_sums(kernels: pl.LazyFrame, known: pl.Series) -> pl.DataFrame:
    """Whole operations per (step, innermost path, name), then added to every enclosing path."""
    innermost = (
        kernels.filter(pl.col("projection_path").is_not_null())
        .group_by(
            pl.col("projection_step").alias("step"),
            pl.col("projection_path").alias("path"),
            pl.col("name").cast(pl.String),
            pl.col("op_class").cast(pl.String),
        )
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("total_ns"),
        )
        .collect(engine="streaming")
    )
    if not innermost.height:
        return pl.DataFrame(schema=_SUMS)
    parts = pl.col("path").str.split(PATH_SEP)
    depth = int(innermost.select(parts.list.len().max()).item())
    enclosing = pl.concat(
        [
            innermost.filter(parts.list.len() > level).with_columns(
                parts.list.head(level + 1).list.join(PATH_SEP).alias("path")
            )
            for level in range(depth)
        ]
    )
    # a phase name holding "/" makes a prefix that is no phase: keep only the run's paths
    return _summed(enclosing.filter(pl.col("path").is_in(known.implode())))


def window_intervals(phases: pl.DataFrame) -> pl.DataFrame:
    """Disjoint intervals ``i_start, i_end`` per (step, path) of window phases.

    Each process's span of the phase in that step, merged where processes overlap or touch
    (:func:`~analysis.intervals.union_blocks`).
    """
    return union_blocks(phases, ["step", "path"]).select(
        "step", "path", pl.col("start_ns").alias("i_start"), pl.col("end_ns").alias("i_end")
    )


def _window_sums(kernels: pl.LazyFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """Clipped time per (step, path, name): each operation's overlap with each phase interval.

    The run's timeline is cut at every interval's ends into segments
    (:func:`~analysis.intervals.segments_of`); each segment knows the
    (step, path) intervals covering it. An operation inside one segment (nearly all) is summed
    per (segment, name) in one streaming pass; the few that cross segment edges are cut into
    pieces, and counted once per phase however many of its segments they cover.
    """
    intervals = window_intervals(phases)
    if not intervals.height:
        return pl.DataFrame(schema=_SUMS)
    bounds = segment_boundaries(intervals["i_start"], intervals["i_end"])
    covers = segments_inside(intervals, bounds, ["step", "path"], start="i_start", end="i_end")
    covers = covers.select("seg", "step", "path")
    edges = pl.lit(bounds)
    # the segments between the first and the last boundary (segments_of: 1 … len − 1)
    first = segment_of(bounds, pl.col("start_ns")).clip(lower_bound=1)
    last = last_segment_of(bounds, pl.col("end_ns")).clip(upper_bound=bounds.len() - 1)
    ops = kernels.select(
        "name", "op_class", "start_ns", "end_ns", first.alias("seg"), last.alias("last")
    ).filter(pl.col("seg") <= pl.col("last"))  # else outside every phase
    inside = (
        ops.filter(pl.col("seg") == pl.col("last"))
        .with_columns(_overlap(edges).alias("total_ns"))  # before the group_by: it streams
        .group_by("seg", "name", "op_class")
        .agg(pl.len().cast(pl.Int64).alias("count"), pl.col("total_ns").sum())
        .collect(engine="streaming")
        .join(covers, on="seg")
    )
    crossing = (
        ops.filter(pl.col("seg") < pl.col("last"))
        .collect(engine="streaming")
        .with_row_index("op")
        .with_columns(pl.int_ranges("seg", pl.col("last") + 1).alias("seg"))
        .explode("seg")
        .with_columns(_overlap(edges).alias("total_ns"))
        .join(covers, on="seg")
        .group_by("op", *_KEYS)
        .agg(pl.col("total_ns").sum())
        .with_columns(pl.lit(1, dtype=pl.Int64).alias("count"))
    )
    typed = [pl.col(c).cast(t) for c, t in _SUMS.items()]
    both = pl.concat([inside.select(typed), crossing.select(typed)], how="vertical")
    return _summed(both.filter(pl.col("total_ns") > 0))


def _overlap(edges: pl.Expr) -> pl.Expr:
    """An operation's time inside its segment ``seg`` (:func:`~analysis.intervals.segments_of`)."""
    seg_start = edges.gather(pl.col("seg") - 1)
    seg_end = edges.gather(pl.col("seg"))
    return pl.min_horizontal("end_ns", seg_end) - pl.max_horizontal("start_ns", seg_start)


def _summed(sums: pl.DataFrame) -> pl.DataFrame:
    return sums.group_by(_KEYS).agg(pl.col("count").sum(), pl.col("total_ns").sum())


def _ranked(per_step: pl.DataFrame, top: int | None) -> pl.DataFrame:
    """Per-step rows and all-steps rows, ranked within each phase, with shares; ``top`` kept."""
    keys = ["attribution", "step", "path", "name", "op_class"]
    over_steps = per_step.group_by(keys[:1] + keys[2:]).agg(
        pl.col("count").sum(), pl.col("total_ns").sum()
    )
    rows = pl.concat(
        [
            per_step.with_columns(pl.lit("step").alias("scope")),
            over_steps.with_columns(
                pl.lit("all").alias("scope"), pl.lit(None, dtype=pl.Int64).alias("step")
            ),
        ],
        how="diagonal",
    ).filter(pl.col("total_ns") > 0)
    phase = ["attribution", "scope", "step", "path"]
    ranked = rows.sort(
        [*phase, "total_ns", "name", "op_class"],
        descending=[False, False, False, False, True, False, False],
        nulls_last=False,
    ).with_columns(
        pl.int_range(1, pl.len() + 1).over(phase).cast(pl.Int64).alias("rank"),
        pl.col("total_ns").sum().over(phase).alias("phase_kernel_ns"),
    )
    if top:
        ranked = ranked.filter(pl.col("rank") <= top)
    return ranked.with_columns(
        (pl.col("total_ns") / pl.col("count")).alias("mean_ns"),
        (100.0 * pl.col("total_ns") / pl.col("phase_kernel_ns")).alias("share_pct"),
    ).select([pl.col(c).cast(t) for c, t in SCHEMA.items()])
