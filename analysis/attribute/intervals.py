"""Busy time (a union of intervals) carried across time buckets: :class:`BusyAccumulator`.

The interval rules themselves (the sweep, union length, segments) live in
:mod:`analysis.intervals`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from ..frames import PolarsDataType
from ..intervals import union_length


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
