"""NVTX ranges on the timeline: one slice per range, on the process and thread that marked it.

Process = (trace file, pid), thread = the range's tid, as nsys shows them (``thread <tid>``,
with its name where the per-range table has a ``thread_name`` column). Ranges nest as they
were marked (push/pop ranges always do; ranges starting at the same instant nest longest
first). Start/end ranges that overlap others without nesting cannot be drawn nested: they go on
an extra track of their thread, ``thread <tid> · overlapping ranges #2``, … Each slice's args
hold the range's own interval (``this range``) and the totals of its phase-table row (trace,
pid, step, path, attribution), which sum over *all* the row's ranges.

Past ``max_ranges`` ranges only the longest are drawn. A range is never shorter than a range
it encloses, so a drawn range's enclosing ranges are drawn too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import polars as pl

from ...intervals import overlaps_earlier
from ...model import Analysis

#: the args group with the range's own interval, and the one with its phase-table row's totals
RANGE_KEY: Final = "this range"
ROW_KEY: Final = "phase-table row (totals over all its ranges)"
RANGE_ARGS: Final = ("start_ns", "end_ns", "dur_ns", "tid", "step", "path", "attribution")
#: the phase table's columns shown per row, where the analysis has them (energy: with power)
ROW_ARGS: Final = (
    *("n_ranges", "wall_ns", "gpu_busy_ns", "idle_ns", "kernel_ns", "nccl_ns", "memcpy_ns"),
    *("memcpy_bytes", "memset_ns", "graph_ns", "n_kernels", "n_graphs", "n_devices"),
    *("gpu_start_ns", "gpu_end_ns", "energy_j", "avg_power_w", "peak_power_w"),
)
ROW_KEYS: Final = ("trace", "pid", "step", "path", "phase", "attribution")
#: an extra track of thread ``tid`` is thread ``tid + lane * LANE_TID`` (nsys tids are 24-bit)
LANE_TID: Final = 1 << 24
#: what a range slice's args mean (the file's ``otherData``)
ARGS_TEXT: Final = (
    f"'{RANGE_KEY}': the range's own start, end, duration (ns, run clock), thread, step, path, "
    f"attribution; '{ROW_KEY}': its phase-table row (trace, pid, step, path, attribution) as in "
    "phases.csv, i.e. summed over all n_ranges ranges of that row, not this range alone"
)

Event = dict[str, Any]


@dataclass(frozen=True)
class RangeSlices:
    """The range slices and their tracks' metadata; what was left out.

    ``slices``: ``pid_v, tid, name, cat, start_ns, end_ns, args``; ``longest_left_out_ns``: the
    longest range not drawn (None: every range is drawn).
    """

    slices: pl.DataFrame
    meta: list[Event]
    n_ranges: int
    longest_left_out_ns: int | None

    @property
    def n_drawn(self) -> int:
        """How many ranges are drawn."""
        return self.slices.height


def nest_lanes(starts: Sequence[int], ends: Sequence[int]) -> list[int]:
    """A lane per interval such that on each lane intervals nest or are disjoint.

    Intervals sorted by start, then longest first; each goes on the first lane where it fits
    inside the innermost interval still open there, or where none is open.
    """
    stacks: list[list[int]] = []
    lanes: list[int] = []
    for start, end in zip(starts, ends, strict=True):
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lanes.append(lane)
                break
        else:
            stacks.append([end])
            lanes.append(len(stacks) - 1)
    return lanes


def longest_first(ranges: pl.DataFrame, max_ranges: int) -> tuple[pl.DataFrame, int | None]:
    """The ``max_ranges`` longest ``ranges``, and the longest duration left out (None: all kept).

    Among equal lengths the earliest start, then the lowest ``rid``, comes first. An enclosing
    range is at least as long as what it encloses and, when as long, starts with
    it and comes first in ``rid`` (as in the drawing's nesting order): it is kept first.
    """
    if ranges.height <= max_ranges:
        return ranges, None
    dur = (pl.col("end_ns") - pl.col("start_ns")).alias("_dur")
    order = ranges.with_columns(dur).sort(
        "_dur", "start_ns", "rid", descending=[True, False, False]
    )
    left_out = int(order["_dur"][max_ranges])
    return order.head(max_ranges).drop("_dur"), left_out


def _finite(column: str) -> pl.Expr:
    """Floats as they are, NaN and infinities as null (JSON has neither)."""
    col = pl.col(column)
    return (
        pl.when(col.is_finite()).then(col) if column.endswith("_w") or "energy" in column else col
    )


def _args(ranges: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """``ranges`` with ``args``: the range's own fields and its phase-table row's totals."""
    shown = [c for c in ROW_ARGS if c in phases.columns]
    rows = phases.select(*ROW_KEYS, *(_finite(c).alias(f"row_{c}") for c in shown))
    ranges = ranges.with_columns(
        pl.col("name").alias("phase"), (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")
    ).join(rows, on=list(ROW_KEYS), how="left", nulls_equal=True, maintain_order="left")
    own = pl.struct(*RANGE_ARGS).alias(RANGE_KEY)
    totals = pl.struct(*(pl.col(f"row_{c}").alias(c) for c in shown)).alias(ROW_KEY)
    return ranges.with_columns(pl.struct(own, totals).alias("args"))


def _lanes(ranges: pl.DataFrame) -> pl.Series:
    """Per thread (``pid_v, tid``, sorted by start then longest first), each range's lane."""
    keys = ["pid_v", "tid"]
    if not ranges.height or not ranges.select(overlaps_earlier(keys).any()).item():
        return pl.Series("lane", [0] * ranges.height, dtype=pl.Int64)  # all disjoint
    lanes: list[int] = []
    for part in ranges.partition_by(keys, maintain_order=True):
        lanes += nest_lanes(part["start_ns"].to_list(), part["end_ns"].to_list())
    return pl.Series("lane", lanes, dtype=pl.Int64)


def _meta(kind: str, pid: int, tid: int, value: str | int) -> Event:
    key = "name" if kind.endswith("_name") else "sort_index"
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {key: value}}


def range_slices(
    ranges: pl.DataFrame, phases: pl.DataFrame, processes: pl.DataFrame, max_ranges: int
) -> RangeSlices:
    """One slice per range of ``ranges`` (the per-range table), the longest ``max_ranges``.

    Slices go on ``processes``' (``trace, pid, pid_v``) thread tracks, args from ``phases``.
    """
    kept, left_out = longest_first(ranges, max_ranges)
    rows = (
        _args(kept, phases)
        .join(processes, on=["trace", "pid"], how="left")
        .sort(
            "pid_v",
            "tid",
            "start_ns",
            "end_ns",
            "rid",
            descending=[False, False, False, True, False],
        )
    )
    rows = rows.with_columns(_lanes(rows))
    rows = rows.with_columns((pl.col("tid") + pl.col("lane") * LANE_TID).alias("tid_v"))
    thread = pl.col("thread_name") if "thread_name" in rows.columns else pl.lit(None, pl.String)
    tracks = (
        rows.group_by("pid_v", "tid", "lane", "tid_v")
        .agg(thread.drop_nulls().first().alias("thread_name"))
        .sort("pid_v", "tid", "lane")
    )
    meta: list[Event] = []
    for i, (pid, tid, lane, tid_v, thread_name) in enumerate(tracks.iter_rows()):
        name = f"thread {tid}" + (f" ({thread_name})" if thread_name else "")
        name += f" · overlapping ranges #{lane + 1}" if lane else ""
        meta += [_meta("thread_name", pid, tid_v, name), _meta("thread_sort_index", pid, tid_v, i)]
    slices = rows.select(
        "pid_v",
        pl.col("tid_v").alias("tid"),
        "name",
        pl.col("attribution").alias("cat"),
        "start_ns",
        "end_ns",
        "args",
    )
    return RangeSlices(slices, meta, ranges.height, left_out)


#: the note when an analysis has no per-range table (a folder an older version wrote)
NO_RANGES: Final = (
    "NVTX ranges not shown: this analysis folder predates per-range output (no "
    "ranges.parquet); re-run `nvtx-phases analyze`, or give timeline the traces"
)


def timeline_ranges(
    analysis: Analysis, ranks: pl.DataFrame, max_ranges: int
) -> tuple[RangeSlices | None, list[str], dict[str, Any]]:
    """``analysis``'s range slices (None without a per-range table), notes, ``otherData``.

    ``ranks``: the processes (``trace, pid, pid_v``) the slices go on.
    """
    if analysis.ranges is None:
        return None, [NO_RANGES], {"ranges": NO_RANGES, "n_ranges": None}
    drawn = range_slices(analysis.ranges, analysis.phases, ranks, max_ranges)
    notes, left_out = [], None
    if drawn.longest_left_out_ns is not None:
        n_out, longest = drawn.n_ranges - drawn.n_drawn, drawn.longest_left_out_ns
        left_out = {"n": n_out, "longest_ns": longest, "max_ranges": max_ranges}
        notes.append(
            f"{drawn.n_ranges:,} NVTX ranges > --max-ranges {max_ranges:,}: the {drawn.n_drawn:,} "
            f"longest drawn (equal lengths: earliest first), {n_out:,} of {longest / 1000:,.3f} "
            "µs or less left out (the phase-table totals in the args still count them); "
            f"--max-ranges {drawn.n_ranges} draws every range"
        )
    other = {
        "ranges": "one slice per phase range (every NVTX range with --all-ranges), on its "
        "process (trace, pid) and thread (tid); "
        "ranges overlapping others without nesting on 'thread <tid> · overlapping ranges #k'",
        "range_args": ARGS_TEXT,
        "n_ranges": drawn.n_ranges,
        "n_ranges_drawn": drawn.n_drawn,
        "ranges_left_out": left_out,
    }
    return drawn, notes, other
