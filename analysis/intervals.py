"""Interval rules, each implemented once: the sweep, elementary segments, the step at an instant.

Intervals are half-open ``[start, end)`` on the integer ns clock; a *group* is a set of key
columns (a device, a (step, path), a thread, …).

- **The sweep** (:func:`reach`): rows sorted by group and start, an interval's *reach* is the
  furthest end among the earlier intervals of its group. Everything about overlapping intervals
  follows from it: an interval overlaps an earlier one when it starts before the reach
  (:func:`overlaps_earlier`); it adds ``end − max(start, reach)`` (at least 0) to the union
  (:func:`past_reach`, summed by :func:`union_length`); it opens a new block of the union when
  it starts ``gap_ns`` or more after the reach (:func:`opens_block`, :func:`union_blocks`).
- **Segments** (:func:`segments_of`): the sorted distinct instants at which intervals start or
  end (:func:`segment_boundaries`) cut the time line into elementary segments, numbered from
  the one before the first boundary (0) to the one after the last (``len(boundaries)``); every
  interval whose ends are boundaries is a run of whole segments (:func:`segments_inside`).
- **The step at an instant** (:func:`window_at`): the window (of several that may overlap) that
  started last at or before the instant, if it is still open then.

Lives at the package's top, below every stage (like :mod:`analysis.frames`): the read,
normalize, aggregate and attribute stages, energy and render all use it, and the stage order
(read < normalize < aggregate < attribute < run) lets a stage import only those below it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1

Keys = str | Sequence[str] | pl.Expr


# --- the sweep -------------------------------------------------------------------------------


def reach(over: Keys | None = None, *, end: str = "end_ns") -> pl.Expr:
    """The furthest ``end`` among the rows before this one in its group (null for the first).

    The frame must be sorted by the group's keys, then by start; ``over`` None: one group.
    """
    ends = pl.col(end).cum_max().shift(1)
    if over is None:
        return ends
    return ends.over(over if isinstance(over, pl.Expr | str) else list(over))


def overlaps_earlier(
    over: Keys | None = None, *, start: str = "start_ns", end: str = "end_ns"
) -> pl.Expr:
    """Whether an interval starts before an earlier interval of its group has ended.

    Touching intervals (one starts where the other ends) do not overlap; a group's first row
    gives null (false in a filter).
    """
    return pl.col(start) < reach(over, end=end)


def past_reach(reach_ns: pl.Expr, *, start: str = "start_ns", end: str = "end_ns") -> pl.Expr:
    """What an interval adds to its group's union: its length past ``reach_ns``, at least 0.

    ``reach_ns`` null (a group's first interval): its whole length.
    """
    return (pl.col(end) - pl.max_horizontal(pl.col(start), reach_ns)).clip(lower_bound=0)


def opens_block(reach_ns: pl.Expr, gap_ns: int, *, start: str = "start_ns") -> pl.Expr:
    """Whether an interval starts a new block: ``gap_ns`` or more after ``reach_ns``, or first.

    ``gap_ns`` 1: intervals that overlap or touch share a block (the union's connected parts);
    0: touching intervals are separate blocks; ``g`` > 1: intervals less than ``g`` apart merge.
    """
    return (reach_ns.is_null() | (pl.col(start) - reach_ns >= gap_ns)).fill_null(True)


def by_group_then_start(
    frame: pl.DataFrame, keys: Sequence[str], *, start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """``keys, start, end`` of ``frame`` sorted by the keys, then by start (nulls first).

    Operations come in start order (the canonical order of :mod:`analysis.run.spill`): then a
    stable sort on the keys alone gives the order, with no sort on start (checked, not assumed).
    Rows tied on keys and start may come in any order: no rule here depends on theirs.
    """
    ordered = frame.select(*keys, start, end)
    if ordered[start].is_sorted():
        return ordered.sort(keys, maintain_order=True)
    return ordered.sort(*keys, start)


def union_length(
    frame: pl.DataFrame, by: Sequence[str], *, start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """Length of the union of the intervals in each group (overlaps counted once), ``busy_ns``.

    The sweep (:func:`past_reach`) without a loop, sorted by the keys. The running maximum is a
    window over each group (``over``), which keeps a group's rows in frame order: in start order
    the frame needs no sort at all (a sort on start only where it is not), and the groups' sums
    are sorted at the end, a table of one row per group. The same window inside
    ``group_by().agg`` took 56 s instead of 1.2 s over a million (segment, GPU) groups.
    """
    keys = list(by)
    if frame.is_empty():
        return frame.select(*keys).head(0).with_columns(pl.lit(0, dtype=pl.Int64).alias("busy_ns"))
    ordered = frame.select(*keys, start, end)
    if not ordered[start].is_sorted():
        ordered = ordered.sort(start)
    return (
        ordered.with_columns(
            past_reach(reach(keys, end=end), start=start, end=end).alias("busy_ns")
        )
        .group_by(keys)
        .agg(pl.col("busy_ns").sum())
        .sort(keys)
    )


def union_blocks(
    frame: pl.DataFrame,
    by: Sequence[str],
    *,
    gap_ns: int = 1,
    start: str = "start_ns",
    end: str = "end_ns",
) -> pl.DataFrame:
    """The union of each group's intervals as disjoint blocks: ``by, start, end`` by group, start.

    A block is a run of intervals each starting less than ``gap_ns`` after the furthest end
    before it (:func:`opens_block`; the default 1 joins overlapping and touching intervals, so
    the blocks are the union's connected parts and their lengths add up to
    :func:`union_length`). Null keys form a group of their own (sorted first).

    Sorted by group and start, a block is a run of consecutive rows: its start is its first
    row's, its end the group's running maximum at its last row (every end at or after its
    start: an end before it falls back to grouping). No ``group_by`` over the blocks, a table as
    long as the operations when few overlap (0.55 s → 0.2 s over a million kernels).
    """
    keys = list(by)
    ordered = by_group_then_start(frame, keys, start=start, end=end)
    opens = opens_block(reach(keys, end=end), gap_ns, start=start)
    if (ordered[end] < ordered[start]).any():
        return (
            ordered.with_columns(opens.cum_sum().alias("_block"))
            .group_by("_block")
            .agg(*(pl.col(k).first() for k in keys), pl.col(start).min(), pl.col(end).max())
            .select(*keys, start, end)
            .sort(*keys, start)
        )
    marked = ordered.with_columns(
        opens.alias("_opens"), pl.col(end).cum_max().over(keys).alias("_furthest")
    )
    closes = pl.col("_opens").shift(-1, fill_value=True)
    firsts = marked.filter(pl.col("_opens")).select(*keys, start)
    return firsts.with_columns(marked.filter(closes)["_furthest"].alias(end))


# --- segments --------------------------------------------------------------------------------


def segment_boundaries(starts: pl.Series, ends: pl.Series) -> pl.Series:
    """Sorted distinct instants at which any interval starts or ends."""
    return pl.concat([starts, ends]).unique().sort().alias("boundary")


def merged_instants(arrays: Sequence[Sequence[int] | np.ndarray]) -> np.ndarray:
    """:func:`segment_boundaries` of numpy arrays each already sorted: their distinct values.

    ``np.unique`` of their concatenation; a stable sort (timsort) merges the sorted runs in
    near-linear time: 30× faster than ``np.unique``'s sort on 8 GPUs × 636,000 samples
    (1.1 s → 0.04 s).
    """
    values = np.concatenate(arrays)
    values.sort(kind="stable")
    if values.size == 0:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


def segments_of(boundaries: pl.Series) -> pl.DataFrame:
    """Elementary segments covering the whole time line: ``seg, seg_start_ns, seg_end_ns``.

    Segment 0 runs from -inf to the first boundary; segment k ≥ 1 from boundary k-1 to boundary
    k (the last to +inf).
    """
    starts = pl.concat([pl.Series([I64_MIN], dtype=pl.Int64), boundaries.cast(pl.Int64)])
    ends = pl.concat([boundaries.cast(pl.Int64), pl.Series([I64_MAX], dtype=pl.Int64)])
    return pl.DataFrame(
        {
            "seg": pl.int_range(0, starts.len(), eager=True).cast(pl.Int64),
            "seg_start_ns": starts,
            "seg_end_ns": ends,
        }
    )


def segment_of(boundaries: pl.Series, instants: pl.Expr) -> pl.Expr:
    """Index of the segment (see :func:`segments_of`) that contains each instant, lazily."""
    return pl.lit(boundaries).search_sorted(instants, side="right").cast(pl.Int64)


def last_segment_of(boundaries: pl.Series, ends: pl.Expr) -> pl.Expr:
    """Index of the segment holding the last instant before each ``end`` (exclusive end)."""
    return pl.lit(boundaries).search_sorted(ends, side="left").cast(pl.Int64)


def segment_index(boundaries: pl.Series, instants: pl.Expr | pl.Series) -> pl.Series:
    """Index of the segment (see :func:`segments_of`) that contains each instant."""
    values = instants if isinstance(instants, pl.Series) else pl.select(instants).to_series()
    return boundaries.search_sorted(values, side="right").cast(pl.Int64)


def segments_inside(
    frame: pl.DataFrame,
    boundaries: pl.Series,
    keep: Sequence[str],
    *,
    start: str = "start_ns",
    end: str = "end_ns",
) -> pl.DataFrame:
    """``keep, seg, first_seg``: each segment inside each interval, whose ends are boundaries.

    ``first_seg`` marks the segment where the interval starts; a zero-length interval has none.
    """
    lo = segment_index(boundaries, frame[start])
    hi = segment_index(boundaries, frame[end])
    return (
        frame.select(*keep)
        .with_columns(lo.alias("_lo"), hi.alias("_hi"))
        .with_columns(pl.int_ranges("_lo", "_hi").alias("seg"))
        .explode("seg")
        .filter(pl.col("seg").is_not_null())
        .select(
            *keep, pl.col("seg").cast(pl.Int64), (pl.col("seg") == pl.col("_lo")).alias("first_seg")
        )
    )


def split_at_segments(
    frame: pl.DataFrame, boundaries: pl.Series, *, start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """One row per (interval, segment it overlaps) with ``seg`` and ``overlap_ns``.

    The overlaps of one interval add up to its length exactly; a zero-length interval gives one
    row with ``overlap_ns = 0`` in the segment of its instant. ``first_piece`` marks the piece that
    holds the interval's start.
    """
    segments = segments_of(boundaries)
    first = segment_index(boundaries, frame[start])
    # last segment whose start lies before the interval's end
    last = boundaries.search_sorted(frame[end], side="left").cast(pl.Int64)
    return (
        frame.with_columns(first.alias("_first"), pl.max_horizontal(last, first).alias("_last"))
        .with_columns(pl.int_ranges("_first", pl.col("_last") + 1).alias("seg"))
        .explode("seg")
        .join(segments, on="seg", how="left")
        .with_columns(
            (
                pl.min_horizontal(pl.col(end), pl.col("seg_end_ns"))
                - pl.max_horizontal(pl.col(start), pl.col("seg_start_ns"))
            )
            .clip(lower_bound=0)
            .alias("overlap_ns"),
            (pl.col("seg") == pl.col("_first")).alias("first_piece"),
        )
        .drop("_first", "_last")
    )


# --- the step at an instant ------------------------------------------------------------------


def window_at(
    windows: pl.DataFrame,
    instants: pl.Series,
    *,
    start: str = "step_start_ns",
    end: str = "step_end_ns",
    value: str = "step",
) -> pl.Series:
    """``value`` of the window that started last at or before each instant, if still open then.

    ``windows`` sorted by ``start`` (among equal starts the last row wins); null where no window
    started by then or the latest has ended (``instant >= end``). A binary search over the few
    windows, not an as-of join that sorts the instants.
    """
    if windows.is_empty():
        return pl.Series(value, [None] * instants.len(), dtype=windows.schema[value])
    index = windows[start].search_sorted(instants, side="right").cast(pl.Int64) - 1
    safe = index.clip(lower_bound=0)
    inside = (index >= 0) & (instants < windows[end].gather(safe))
    return (
        pl.select(pl.when(pl.lit(inside)).then(pl.lit(windows[value].gather(safe))))
        .to_series()
        .alias(value)
    )


# --- coverage by disjoint blocks -------------------------------------------------------------


def covered_length(
    blocks: pl.DataFrame,
    queries: pl.DataFrame,
    by: Sequence[str],
    *,
    start: str = "start_ns",
    end: str = "end_ns",
) -> pl.Series:
    """Per query interval ``[start, end)``, its length covered by the ``blocks`` of its group.

    ``blocks``: disjoint intervals per group (``by, start, end``; :func:`union_blocks` gives
    them). With ``C(t)`` the blocks' length before instant ``t`` (the cumulative length of the
    earlier blocks plus the part of the block holding ``t``, found by an as-of join on the
    blocks' starts), a query covers ``C(end) − C(start)``: exact, without pairing queries and
    blocks. Returned in the order of ``queries``; 0 where the group has no block.
    """
    keys = list(by)
    lengths = (pl.col("_b_end") - pl.col("_b_start")).alias("_len")
    table = (
        blocks.select(*keys, pl.col(start).alias("_b_start"), pl.col(end).alias("_b_end"))
        .sort(*keys, "_b_start")
        .with_columns(lengths)
        .with_columns((pl.col("_len").cum_sum() - pl.col("_len")).over(keys).alias("_before"))
        .sort("_b_start")
    )

    def cumulative(at: str) -> pl.Series:
        instants = (
            queries.select(*keys, pl.col(at).alias("_t"))
            .with_row_index("_q")
            .sort("_t")
            .join_asof(
                table,
                left_on="_t",
                right_on="_b_start",
                by=keys,
                strategy="backward",
                check_sortedness=False,
            )
            .with_columns(
                (
                    pl.col("_before")
                    + (pl.col("_t") - pl.col("_b_start"))
                    .clip(lower_bound=0)
                    .clip(upper_bound=pl.col("_len"))
                )
                .fill_null(0)
                .alias("_c")
            )
            .sort("_q")
        )
        return instants["_c"]

    return (cumulative(end) - cumulative(start)).cast(pl.Int64).alias("covered_ns")
