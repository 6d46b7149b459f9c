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

from dataclasses import dataclass

import polars as pl

from ..frames import int_value
from ..intervals import (
    overlaps_earlier,
    segment_boundaries,
    segment_index,
    segments_inside,
    segments_of,
    split_at_segments,
)
from ..model import THREAD
from .pools import WHOLE, Pools

#: per launching thread (trace, gtid): its range boundaries, and ``seg, rid, end_ns`` for every
#: segment each range covers (see :func:`enclosure_layout`)
EnclosureLayout = dict[tuple[str, int], tuple[pl.Series, pl.DataFrame]]
_PAIRS = {"op_id": pl.Int64, "rid": pl.Int64}


def enclosure_layout(ranges: pl.DataFrame) -> EnclosureLayout:
    """What :func:`projection_pairs` needs of ``ranges`` (``rid, trace, gtid, start_ns, end_ns``).

    Per thread, the instants where a range starts or ends cut the time line into segments; a
    range ``[start, end]`` includes both ends, so on the integer ns clock it covers
    ``[start, end + 1)``: the segments from its start's to the one ending at ``end + 1``.
    """
    layout: EnclosureLayout = {}
    for (trace, gtid), mine in ranges.partition_by(list(THREAD), as_dict=True).items():
        spans = mine.select("rid", "start_ns", (pl.col("end_ns") + 1).alias("end_ns"))
        cuts = segment_boundaries(spans["start_ns"], spans["end_ns"])
        covering = range_segments(spans, cuts).join(mine.select("rid", "end_ns"), on="rid")
        layout[(str(trace), int(gtid))] = (cuts, covering.select("seg", "rid", "end_ns"))
    return layout


def projection_pairs(
    ops: pl.DataFrame, ranges: pl.DataFrame, layout: EnclosureLayout | None = None
) -> pl.DataFrame:
    """(op_id, rid) for every range enclosing the op's launch call on the launching thread.

    Exactly NVIDIA's definition, whatever the nesting (start/end ranges that overlap without
    nesting included): the ranges enclosing a call are those covering the instant it starts
    (the ranges covering its segment) that end at or after it ends. ``layout``: from
    :func:`enclosure_layout` of ``ranges`` (computed here when not given).
    """
    layout = enclosure_layout(ranges) if layout is None else layout
    launched = ops.filter(pl.col("gtid").is_not_null()).select(
        "op_id", *THREAD, "call_start_ns", "call_end_ns"
    )
    found: list[pl.DataFrame] = [pl.DataFrame(schema=_PAIRS)]
    if not layout or launched.is_empty():
        return found[0]
    for (trace, gtid), calls in launched.partition_by(list(THREAD), as_dict=True).items():
        mine = layout.get((str(trace), int(gtid)))
        if mine is None:
            continue
        cuts, covering = mine
        found.append(
            calls.select(
                "op_id", "call_end_ns", segment_index(cuts, calls["call_start_ns"]).alias("seg")
            )
            .join(covering, on="seg")
            .filter(pl.col("end_ns") >= pl.col("call_end_ns"))
            .select("op_id", "rid")
        )
    return pl.concat(found)


def innermost_by_segment(window_ranges: pl.DataFrame, boundaries: pl.Series) -> pl.DataFrame:
    """For every elementary segment, the innermost window range active in it (``rid`` or null).

    Innermost = deepest nesting level; between threads at equal depth, the later start wins.
    At each level one as-of join per thread finds the range that started last: the only one
    active then, unless ranges of that level overlap (start/end ranges that do not nest),
    whose segments are listed one by one (:func:`_tangled`).
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
    tangled = _tangled(window_ranges)
    if tangled.height:
        candidates.append(
            range_segments(tangled, boundaries)
            .join(tangled.select("rid", "level", "start_ns"), on="rid")
            .select("seg", "rid", "level", "start_ns")
        )
    if not candidates:
        return segments.select("seg", pl.lit(None, dtype=pl.Int64).alias("rid"))
    best = (
        pl.concat(candidates)
        .sort(["seg", "level", "start_ns", "rid"], descending=[False, True, True, True])
        .unique(subset="seg", keep="first")
    )
    return segments.select("seg").join(best.select("seg", "rid"), on="seg", how="left")


def _tangled(ranges: pl.DataFrame) -> pl.DataFrame:
    """Ranges overlapping another range of their thread and level (nested ranges never do)."""
    keys = [*THREAD, "level"]
    ordered = ranges.select("rid", *keys, "start_ns", "end_ns").sort([*keys, "start_ns", "end_ns"])
    after = pl.col("start_ns").shift(-1).over(keys)
    return ordered.filter(overlaps_earlier(keys) | (pl.col("end_ns") > after))


def window_layout(window_ranges: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """The window timeline's boundaries and the innermost range of each segment."""
    boundaries = (
        segment_boundaries(window_ranges["start_ns"], window_ranges["end_ns"])
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
    """(rid, seg, first_seg) for every elementary segment inside each range.

    ``first_seg`` marks the segment where the range starts (:func:`segments_inside`).
    """
    return segments_inside(ranges, boundaries, ["rid"])


@dataclass(frozen=True)
class PoolTimeline:
    """One GPU pool's window timeline (see :mod:`analysis.attribute.pools`).

    Its window ranges, their boundaries and the innermost range of each of its segments, and its
    GPUs (None: every GPU of the run, a run without pools). Segment numbers are the pool's own;
    ``seg_offset`` makes them the run's (pools' segments numbered one after another).
    """

    pool: str
    devices: tuple[str, ...] | None
    ranges: pl.DataFrame
    boundaries: pl.Series
    innermost: pl.DataFrame
    seg_offset: int

    def run_segments(self, frame: pl.DataFrame) -> pl.DataFrame:
        """``frame`` with its ``seg`` column numbered on the run (the pool's offset added)."""
        if not self.seg_offset:
            return frame
        return frame.with_columns(pl.col("seg") + self.seg_offset)

    def mine(self, ops: pl.DataFrame) -> pl.DataFrame:
        """The operations on this pool's GPUs."""
        if self.devices is None:
            return ops
        return ops.filter(pl.col("device").is_in(list(self.devices)))


#: the run's window timelines, one per pool (one for a run without pools)
WindowLayout = tuple[PoolTimeline, ...]


def pool_layouts(timeline: pl.DataFrame, pools: Pools | None = None) -> WindowLayout:
    """Each pool's window timeline over its processes' ranges of ``timeline``.

    Without pools (or ``pools`` None) one timeline of every range and every GPU: exactly
    :func:`window_layout` of ``timeline``.
    """
    if pools is None or not pools.split:
        boundaries, innermost = window_layout(timeline)
        return (PoolTimeline(WHOLE, None, timeline, boundaries, innermost, 0),)
    with_pool = pools.pool_of(timeline)
    layouts: list[PoolTimeline] = []
    offset = 0
    for pool, devices in pools.devices.items():
        mine = with_pool.filter(pl.col("pool") == pool).drop("pool")
        boundaries, innermost = window_layout(mine)
        layouts.append(PoolTimeline(pool, devices, mine, boundaries, innermost, offset))
        offset += boundaries.len() + 1  # segments 0 … len(boundaries)
    return tuple(layouts)


def pooled_pieces(ops: pl.DataFrame, layouts: WindowLayout) -> pl.DataFrame:
    """:func:`window_pieces` of each pool's operations on its own timeline (run's segments).

    Operations on GPUs of no pool have no piece: they are window-unattributed.
    """
    parts = [t.run_segments(window_pieces(t.mine(ops), t.boundaries, t.innermost)) for t in layouts]
    return parts[0] if len(parts) == 1 else pl.concat(parts)


def pooled_range_segments(ranges: pl.DataFrame, layouts: WindowLayout) -> pl.DataFrame:
    """:func:`range_segments` of each range on its pool's timeline, segments numbered on the run.

    ``ranges``: window ranges (``rid, start_ns, end_ns``), each in one pool's timeline.
    """
    parts = []
    for t in layouts:
        mine = ranges if len(layouts) == 1 else ranges.join(t.ranges.select("rid"), on="rid")
        parts.append(t.run_segments(range_segments(mine, t.boundaries)))
    return parts[0] if len(parts) == 1 else pl.concat(parts)


def pooled_innermost(layouts: WindowLayout) -> pl.DataFrame:
    """``seg, rid``: the innermost range of every segment of every pool, numbered on the run."""
    parts = [t.run_segments(t.innermost) for t in layouts]
    return parts[0] if len(parts) == 1 else pl.concat(parts)


def window_devices(layouts: WindowLayout, run_devices: list[str]) -> pl.DataFrame:
    """``rid, device``: the GPUs each window range is attributed (its pool's)."""
    parts = [
        t.ranges.select("rid").join(
            pl.DataFrame(
                {"device": list(run_devices if t.devices is None else t.devices)},
                schema={"device": pl.String},
            ),
            how="cross",
        )
        for t in layouts
    ]
    return pl.concat(parts)
