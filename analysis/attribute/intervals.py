"""Interval arithmetic on frames: union length and splitting intervals at fixed boundaries."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from ..frames import PolarsDataType

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


def union_length(
    frame: pl.DataFrame, by: Sequence[str], *, start: str = "start_ns", end: str = "end_ns"
) -> pl.DataFrame:
    """Length of the union of the intervals in each group (overlaps counted once), ``busy_ns``.

    Sweep without a loop: sorted by group and start, each interval adds only what lies past the
    furthest end seen so far in its group. The running maximum is a window over consecutive
    runs of a group (``rle_id`` of the sorted keys), computed before grouping: the same window
    inside ``group_by().agg`` took 56 s instead of 1.2 s over a million (segment, GPU) groups.
    """
    keys = list(by)
    if frame.is_empty():
        return frame.select(*keys).head(0).with_columns(pl.lit(0, dtype=pl.Int64).alias("busy_ns"))
    # by start, then stably by the keys: (keys, start) order, in a third of the time of one
    # sort on all of them (operations come nearly in start order; one sort on several columns
    # encodes every row)
    ordered = frame.select(*keys, start, end).sort(start).sort(keys, maintain_order=True)
    group = pl.struct(keys).rle_id()
    first_of_group = (group != group.shift(1)).fill_null(True)
    reach = pl.when(first_of_group).then(None).otherwise(pl.col(end).cum_max().over(group).shift(1))
    covered = (pl.col(end) - pl.max_horizontal(pl.col(start), reach.fill_null(I64_MIN))).clip(
        lower_bound=0
    )
    return (
        ordered.with_columns(covered.alias("busy_ns"))
        .group_by(keys, maintain_order=True)
        .agg(pl.col("busy_ns").sum())
    )


def segment_boundaries(starts: pl.Series, ends: pl.Series) -> pl.Series:
    """Sorted distinct instants at which any interval starts or ends."""
    return pl.concat([starts, ends]).unique().sort().alias("boundary")


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


def segment_index(boundaries: pl.Series, instants: pl.Expr | pl.Series) -> pl.Series:
    """Index of the segment (see :func:`segments_of`) that contains each instant."""
    values = instants if isinstance(instants, pl.Series) else pl.select(instants).to_series()
    return boundaries.search_sorted(values, side="right").cast(pl.Int64)


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
    pieces = (
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
    return pieces


class BusyAccumulator:
    """Union length per key over intervals that arrive in time buckets, exactly.

    Buckets hold the operations that *start* in ``[lo, hi)``; an interval may run past ``hi``.
    :meth:`add` counts each interval's part before ``hi`` now and carries the rest into the next
    bucket, so every instant is counted in one bucket, with every interval that covers it present.
    Summing the buckets' unions therefore equals the union over the whole run.
    """

    def __init__(
        self, keys: Mapping[str, PolarsDataType], *, devices: Sequence[str] | None = None
    ) -> None:
        """Group by ``keys``.

        With ``devices`` (every device name the intervals carry), ``keys`` are one integer id
        and ``device``, and unions run on one Int64 key ``id × len(devices) + device index``:
        sorting on it takes a fraction of the time of sorting on an integer and a string.
        """
        self.schema = dict(keys)
        self.keys = list(keys)
        self._devices = list(devices) if devices is not None else None
        if self._devices is not None:
            (self._id,) = [k for k in self.keys if k != "device"]
        self._carry: pl.DataFrame | None = None
        self._parts: list[pl.DataFrame] = []

    def _encoded(self, intervals: pl.DataFrame) -> pl.DataFrame:
        if self._devices is None:
            return intervals.select(*self.keys, "start_ns", "end_ns")
        index = (
            pl.col("device").replace_strict(
                self._devices, range(len(self._devices)), return_dtype=pl.Int64
            )
            if self._devices
            else pl.lit(None, dtype=pl.Int64)  # no device: no interval either
        )
        key = pl.col(self._id).cast(pl.Int64) * len(self._devices) + index
        return intervals.select(key.alias("_key"), "start_ns", "end_ns")

    def _decoded(self, busy: pl.DataFrame) -> pl.DataFrame:
        if self._devices is None:
            return busy
        n = max(len(self._devices), 1)
        return busy.select(
            (pl.col("_key") // n).cast(self.schema[self._id]).alias(self._id),
            (pl.col("_key") % n)
            .replace_strict(range(n), self._devices, return_dtype=pl.String)
            .alias("device"),
            "busy_ns",
        ).select(*self.keys, "busy_ns")

    def add(self, intervals: pl.DataFrame, until_ns: int | None) -> None:
        """Intervals (``keys, start_ns, end_ns``) of the bucket that ends at ``until_ns``."""
        self._add(self._encoded(intervals), until_ns)

    def _add(self, frame: pl.DataFrame, until_ns: int | None) -> None:
        if self._carry is not None and self._carry.height:
            frame = pl.concat([self._carry, frame])
        if until_ns is None:
            now, self._carry = frame, None
        else:
            now = frame.with_columns(pl.min_horizontal("end_ns", pl.lit(until_ns))).filter(
                pl.col("end_ns") > pl.col("start_ns")
            )
            self._carry = frame.filter(pl.col("end_ns") > until_ns).with_columns(
                pl.max_horizontal("start_ns", pl.lit(until_ns))
            )
        if now.height:
            self._parts.append(union_length(now, self._union_keys))

    @property
    def _union_keys(self) -> list[str]:
        return ["_key"] if self._devices is not None else self.keys

    def result(self) -> pl.DataFrame:
        """``keys, busy_ns`` over everything added (the carry closes at +inf)."""
        if self._carry is not None and self._carry.height:
            self._add(self._carry.head(0), None)
        if not self._parts:
            return pl.DataFrame(schema={**self.schema, "busy_ns": pl.Int64})
        summed = pl.concat(self._parts).group_by(self._union_keys).agg(pl.col("busy_ns").sum())
        return self._decoded(summed)
