"""GPU operations → the CUDA API call that launched them (joined on process and correlationId).

A trace has about one launching call per GPU operation, millions in a big export. The calls are
kept as one sorted key column plus three value columns, and each batch of operations finds its
call by binary search: no hash table is rebuilt per batch, and no copy of the calls per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from ..errors import UnsupportedExport
from ..frames import PolarsDataType
from .events import RUNTIME_SCHEMA

CALL_COLUMNS: dict[str, PolarsDataType] = {
    "gtid": pl.Int64,
    "call_start_ns": pl.Int64,
    "call_end_ns": pl.Int64,
}
_PID_LIMIT = 1 << 24  # pids come from 24 bits of globalTid
_CORRELATION_LIMIT = 1 << 32  # CUPTI correlation ids are 32-bit


def _key(pid: pl.Expr, correlation_id: pl.Expr) -> pl.Expr:
    return pid * _CORRELATION_LIMIT + correlation_id


@dataclass
class CallIndex:
    """One trace's launching calls, unique per (pid, correlationId), sorted by that key."""

    keys: pl.Series
    calls: pl.DataFrame
    #: (pid, correlationId) keys that more than one call carried (the earliest call is kept)
    n_duplicated: int
    n_calls: int

    @classmethod
    def build(cls, runtime: pl.DataFrame) -> CallIndex:
        """From runtime rows of one trace (:data:`analysis.normalize.events.RUNTIME_SCHEMA` columns)."""
        inside = (
            runtime["pid"].is_between(0, _PID_LIMIT - 1)
            & runtime["correlation_id"].is_between(0, _CORRELATION_LIMIT - 1)
        ).all()
        if not inside:
            raise UnsupportedExport(
                "a CUDA API call has a pid or correlationId outside 0..2^24 / 0..2^32 "
                "(not an nsys export layout this version knows; please report it)"
            )
        calls = (
            runtime.select(
                _key(pl.col("pid"), pl.col("correlation_id")).alias("key"),
                "gtid",
                pl.col("start_ns").alias("call_start_ns"),
                pl.col("end_ns").alias("call_end_ns"),
            )
            # duplicates: the earliest call of a key wins (ties broken on every column)
            .sort("key", "call_start_ns", "call_end_ns", "gtid")
        )
        # sorted: the first call of a key is the row whose key differs from the row before
        first = calls["key"].ne_missing(calls["key"].shift(1))
        unique = calls.filter(first)
        n_duplicated = calls.filter(~first)["key"].n_unique() if unique.height < calls.height else 0
        return cls(
            keys=unique["key"],
            calls=unique.select(list(CALL_COLUMNS)),
            n_duplicated=n_duplicated,
            n_calls=runtime.height,
        )

    @classmethod
    def empty(cls) -> CallIndex:
        """No calls recorded (API tracing off): every operation stays unlinked."""
        return cls.build(pl.DataFrame(schema=RUNTIME_SCHEMA))

    def link(self, ops: pl.DataFrame) -> pl.DataFrame:
        """``ops`` (one trace) with ``gtid, call_start_ns, call_end_ns`` (null: no call found)."""
        if self.keys.is_empty() or ops.is_empty():
            return ops.with_columns(pl.lit(None, dtype=t).alias(c) for c, t in CALL_COLUMNS.items())
        wanted = ops.select(_key(pl.col("pid"), pl.col("correlation_id"))).to_series()
        position = self.keys.search_sorted(wanted, side="left").cast(pl.Int64)
        safe = position.clip(upper_bound=self.keys.len() - 1)
        found = (position < self.keys.len()) & (self.keys.gather(safe) == wanted)
        found = found.fill_null(False)
        calls = self.calls.select(pl.all().gather(safe))
        return ops.with_columns(
            pl.when(pl.lit(found)).then(pl.lit(calls[c])).alias(c) for c in CALL_COLUMNS
        )


def duplicate_warning(n_duplicated: int) -> list[str]:
    """The warning for correlationIds carried by more than one call (none when 0)."""
    if not n_duplicated:
        return []
    return [
        f"{n_duplicated} correlationId(s) appear on more than one CUDA API call of a "
        "process; the earliest call of each is used"
    ]


def orphan_warning(n_orphans: int, n_ops: int, n_calls: int) -> list[str]:
    """The warning for operations whose launching call is missing (none when 0 or no calls)."""
    if not n_orphans or not n_calls:
        return []
    return [
        f"{n_orphans} of {n_ops} GPU operation(s) have no matching CUDA API call "
        "(capture started mid-launch, or API tracing off); they are unattributed under projection"
    ]
