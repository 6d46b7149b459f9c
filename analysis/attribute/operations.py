"""GPU operations → NVTX phase ranges, under two clearly separate schemes.

*projection* (NVIDIA's definition, as in ``nsys stats -r nvtxkernsum``): an operation belongs to
every range on the CPU thread that launched it whose interval encloses the launching CUDA API
call (``range.start <= call.start`` and ``range.end >= call.end``), joined on correlationId within
the process. Whole operations are counted.

*window* (cross-process): an operation on any device belongs, for each instant it runs, to the
driver-side phase active at that instant. Operations straddling a phase boundary are split at it.
This is what attributes a VeRL worker's kernels to the trainer's ``gen``/``update_actor``.
"""

from __future__ import annotations

import polars as pl

from analysis.attribute.intervals import segment_index, segments_of, split_at_segments
from analysis.frames import int_value
from analysis.model import THREAD


def projection_pairs(ops: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """(op_id, rid) for every range enclosing the op's launch call on the launching thread.

    Ranges on one thread nest, so at each level at most one range can enclose a call: the last
    one starting before it. One as-of join per nesting level finds it.
    """
    launched = (
        ops.filter(pl.col("gtid").is_not_null())
        .select("op_id", *THREAD, "call_start_ns", "call_end_ns")
        .sort("call_start_ns")
    )
    found: list[pl.DataFrame] = []
    if ranges.is_empty() or launched.is_empty():
        return pl.DataFrame(schema={"op_id": pl.Int64, "rid": pl.Int64})
    for level in range(int_value(ranges["level"].max()) + 1):
        layer = (
            ranges.filter(pl.col("level") == level)
            .select("rid", *THREAD, "start_ns", "end_ns")
            .sort("start_ns")
        )
        if layer.is_empty():
            continue
        hit = launched.join_asof(
            layer,
            left_on="call_start_ns",
            right_on="start_ns",
            by=THREAD,
            strategy="backward",
            check_sortedness=False,  # both sides sorted on their keys just above
        ).filter(pl.col("rid").is_not_null() & (pl.col("end_ns") >= pl.col("call_end_ns")))
        found.append(hit.select("op_id", "rid"))
    return pl.concat(found) if found else pl.DataFrame(schema={"op_id": pl.Int64, "rid": pl.Int64})


def innermost_by_segment(window_ranges: pl.DataFrame, boundaries: pl.Series) -> pl.DataFrame:
    """For every elementary segment, the innermost window range active in it (``rid`` or null).

    Innermost = deepest nesting level; between threads at equal depth, the later start wins.
    """
    segments = segments_of(boundaries).select("seg", "seg_start_ns")
    threads = window_ranges.select(THREAD).unique()
    grid = segments.join(threads, how="cross").sort("seg_start_ns")
    candidates: list[pl.DataFrame] = []
    for level in range(int_value(window_ranges["level"].max()) + 1 if window_ranges.height else 0):
        layer = (
            window_ranges.filter(pl.col("level") == level)
            .select("rid", *THREAD, "start_ns", "end_ns", "level")
            .sort("start_ns")
        )
        if layer.is_empty():
            continue
        hit = grid.join_asof(
            layer,
            left_on="seg_start_ns",
            right_on="start_ns",
            by=THREAD,
            strategy="backward",
            check_sortedness=False,
        ).filter(pl.col("rid").is_not_null() & (pl.col("end_ns") > pl.col("seg_start_ns")))
        candidates.append(hit.select("seg", "rid", "level", "start_ns"))
    if not candidates:
        return segments.select("seg", pl.lit(None, dtype=pl.Int64).alias("rid"))
    best = (
        pl.concat(candidates)
        .sort(["seg", "level", "start_ns", "rid"], descending=[False, True, True, True])
        .unique(subset="seg", keep="first")
    )
    return segments.select("seg").join(best.select("seg", "rid"), on="seg", how="left")


def window_layout(window_ranges: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """The window timeline's boundaries and the innermost range of each segment."""
    boundaries = (
        pl.concat([window_ranges["start_ns"], window_ranges["end_ns"]]).unique().sort()
        if window_ranges.height
        else pl.Series("boundary", [], dtype=pl.Int64)
    )
    return boundaries, innermost_by_segment(window_ranges, boundaries)


def window_pieces(
    ops: pl.DataFrame, boundaries: pl.Series, innermost: pl.DataFrame
) -> pl.DataFrame:
    """Split every op at window-range boundaries; each piece gets the innermost range ``rid``.

    Columns: ``op_id, device, op_class, kind, bytes, seg, overlap_ns, first_piece,
    piece_start_ns, piece_end_ns, rid``.
    """
    pieces = split_at_segments(
        ops.select("op_id", "device", "kind", "op_class", "bytes", "start_ns", "end_ns"), boundaries
    ).with_columns(
        pl.max_horizontal("start_ns", "seg_start_ns").alias("piece_start_ns"),
        pl.min_horizontal("end_ns", "seg_end_ns").alias("piece_end_ns"),
    )
    return pieces.join(innermost, on="seg", how="left")


def range_segments(ranges: pl.DataFrame, boundaries: pl.Series) -> pl.DataFrame:
    """(rid, seg) for every elementary segment inside each range."""
    lo = segment_index(boundaries, ranges["start_ns"])
    hi = segment_index(boundaries, ranges["end_ns"])
    return (
        ranges.select("rid")
        .with_columns(lo.alias("lo"), hi.alias("hi"))
        .with_columns(pl.int_ranges("lo", "hi").alias("seg"))
        .explode("seg")
        .filter(pl.col("seg").is_not_null())
        .select("rid", pl.col("seg").cast(pl.Int64))
    )
