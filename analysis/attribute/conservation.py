"""The run's GPU time totals, and a conservation check between independently computed sides.

Under each scheme, the GPU time the phase table attributes plus the time it leaves unattributed
must equal the operations' own total. The three are computed on separate paths, so a bug that
drops or doubles an operation in the attribution breaks the equality (tested by mutating the
attribution):

- total: ``end − start`` summed over the operations as read;
- window, attributed: the per-(segment, device) sums the window rows are built from, over the
  segments whose innermost window phase exists (innermost phase wins: each instant once);
- window, unattributed: from the operations as read, the time outside the union of the
  window timeline's ranges (prefix sums over its merged blocks; no splitting, no innermost);
- projection, attributed: the per-range sums the projection rows are built from, over the
  top-level ranges (level 0). They partition the operations launched inside top-level ranges:
  an operation has one launching thread, and top-level ranges of a thread share at most an
  instant (a range is top-level when no range of its thread is open as it starts). Two
  corrections keep this exact: a zero-length call at the instant where one top-level range
  ends and the next starts lies in both (counted twice by the rows: the extra counts are taken
  off), and an operation enclosed only by a deeper range (start/end ranges that do not nest:
  a child running past its parent's end) is added, once;
- projection, unattributed: from the operations as read, those whose launching call no
  projection range of the launching thread encloses (``start <= call start`` and ``end >= call
  end``, tested against the running maximum of range ends: no levels, no segments), and those
  without a launching call.

A ``--steps`` selection cannot be checked this way (its phase rows are chosen by the range's
step, its operations by the step at their start): it keeps the whole run's verdict.
"""

from __future__ import annotations

import dataclasses

import polars as pl

from ..aggregate.activity import operation_counts
from ..energy.idle import busy_blocks
from ..model import THREAD, GpuTotals
from .operations import WindowLayout

#: the time columns whose sum is an operation's (or a piece's) GPU time
TIME_COLUMNS = ("kernel_ns", "memcpy_ns", "memset_ns", "graph_ns")
_TOTALS = tuple(
    f.name
    for f in dataclasses.fields(GpuTotals)
    if f.name
    not in (
        "gpu_time_conserved",
        "attributed_gpu_ns",
        "projection_attributed_gpu_ns",
    )
)


def _time(frame: pl.DataFrame) -> int:
    """Total GPU time of per-range or per-segment sums (all kinds)."""
    if frame.is_empty():
        return 0
    return int(frame.select(pl.sum_horizontal(*TIME_COLUMNS).sum()).item() or 0)


class RunTotals:
    """Totals and the independent sides of the conservation check, bucket by bucket."""

    def __init__(self, layouts: WindowLayout, proj_ranges: pl.DataFrame) -> None:
        # per pool: its GPUs (None: every GPU) and its timeline's merged blocks
        self._pools = [(t.pool, t.devices, _Covered(t.ranges)) for t in layouts]
        #: per pool: ``[total_gpu_ns, unattributed_gpu_ns]`` of the operations on its GPUs
        self.pool_sums: dict[str, list[int]] = {t.pool: [0, 0] for t in layouts}
        # per launching thread: range starts in order, and the furthest end reached so far
        self._reach: dict[tuple[str, int], tuple[pl.Series, pl.Series]] = {
            (str(trace), int(gtid)): (
                group["start_ns"],
                group["end_ns"].cum_max(),
            )
            for (trace, gtid), group in proj_ranges.select(*THREAD, "start_ns", "end_ns")
            .sort([*THREAD, "start_ns"])
            .partition_by(list(THREAD), as_dict=True)
            .items()
        }
        self._top = proj_ranges.filter(pl.col("level") == 0)["rid"]
        self._escaping = _escaping(proj_ranges)
        self._touching = _touching(proj_ranges.filter(pl.col("level") == 0))
        self.sums: dict[str, int] = dict.fromkeys((*_TOTALS, "outside_top_ns", "shared_top_ns"), 0)

    def add(self, ops: pl.DataFrame, pairs: pl.DataFrame) -> None:
        """One bucket's operations (as read) and its projection pairs (``op_id, rid``)."""
        dur = (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns")
        counted = ops.with_columns(dur).select(
            pl.col("dur_ns").sum().alias("total_gpu_ns"), *operation_counts()
        )
        row = counted.row(0, named=True)
        row["unattributed_gpu_ns"] = self._uncovered_ns(ops)
        row["projection_unattributed_gpu_ns"] = self._unenclosed_ns(ops)
        row["outside_top_ns"] = self._outside_top_ns(ops, pairs)
        row["shared_top_ns"] = self._shared_top_ns(ops, pairs)
        for name in self.sums:
            self.sums[name] += int(row[name] or 0)

    def _uncovered_ns(self, ops: pl.DataFrame) -> int:
        """Time of these operations outside every window range of their GPU's pool.

        An operation on a GPU of no pool lies outside them all.
        """
        total = int((ops["end_ns"] - ops["start_ns"]).sum() or 0)
        covered = 0
        for pool, devices, blocks in self._pools:
            mine = ops if devices is None else ops.filter(pl.col("device").is_in(list(devices)))
            inside = blocks.covered_ns(mine)
            mine_total = int((mine["end_ns"] - mine["start_ns"]).sum() or 0)
            self.pool_sums[pool][0] += mine_total
            self.pool_sums[pool][1] += mine_total - inside
            covered += inside
        return total - covered

    def _unenclosed_ns(self, ops: pl.DataFrame) -> int:
        """Time of the operations no projection range on the launching thread encloses.

        A range encloses a call when it starts at or before the call's start and ends at or
        after its end: some range does exactly when the furthest end among the ranges starting
        at or before the call's start reaches the call's end.
        """
        dur = pl.col("end_ns") - pl.col("start_ns")
        enclosed = 0
        launched = ops.filter(pl.col("gtid").is_not_null()).select(
            *THREAD, "call_start_ns", "call_end_ns", dur.alias("dur_ns")
        )
        for (trace, gtid), part in launched.partition_by(list(THREAD), as_dict=True).items():
            found = self._reach.get((str(trace), int(gtid)))
            if found is None:
                continue
            starts, reach = found
            last = starts.search_sorted(part["call_start_ns"], side="right").cast(pl.Int64) - 1
            furthest = reach.gather(last.clip(lower_bound=0))
            inside = (last >= 0) & (furthest >= part["call_end_ns"])
            enclosed += int(part["dur_ns"].filter(inside).sum() or 0)
        return int(ops.select(dur.sum()).item() or 0) - enclosed

    def _outside_top_ns(self, ops: pl.DataFrame, pairs: pl.DataFrame) -> int:
        """Time of operations a deeper projection range holds but no top-level range does.

        Only ranges that reach outside every top-level range of their thread (start/end ranges
        that do not nest) can hold such operations; any other operation a deeper range holds
        lies in the top-level range around it (so losing that pair breaks the balance).
        """
        if self._escaping.is_empty() or pairs.is_empty():
            return 0
        held = pairs.filter(pl.col("rid").is_in(self._escaping.implode()))["op_id"]
        top = pairs.filter(pl.col("rid").is_in(self._top.implode()))["op_id"]
        lone = ops.filter(
            pl.col("op_id").is_in(held.implode()) & ~pl.col("op_id").is_in(top.implode())
        )
        return int((lone["end_ns"] - lone["start_ns"]).sum() or 0)

    def _shared_top_ns(self, ops: pl.DataFrame, pairs: pl.DataFrame) -> int:
        """Time the top-level rows count more than once.

        That is ``(k − 1) × duration`` of each operation whose zero-length launching call lies
        where ``k`` top-level ranges touch. A call ``[t, t]`` at the instant one top-level range
        ends and the next starts lies in both (NVIDIA's definition includes both ends); no other
        call can.
        """
        if not self._touching or pairs.is_empty():
            return 0
        top = pairs.filter(pl.col("rid").is_in(self._top.implode())).unique()
        shared = top.group_by("op_id").agg(pl.len().alias("k")).filter(pl.col("k") > 1)
        if shared.is_empty():
            return 0
        return int(
            shared.join(ops, on="op_id")
            .filter(pl.col("call_start_ns") == pl.col("call_end_ns"))
            .select(((pl.col("k") - 1) * (pl.col("end_ns") - pl.col("start_ns"))).sum())
            .item()
            or 0
        )

    def totals(self, innermost_sums: pl.DataFrame, top_sums: pl.DataFrame) -> GpuTotals:
        """The run's :class:`GpuTotals`.

        ``innermost_sums``: the window's per-(segment, device) sums of segments with an
        innermost phase; ``top_sums``: the projection's per-range sums of level-0 ranges.
        """
        sums = dict(self.sums)
        outside_top = sums.pop("outside_top_ns")
        shared_top = sums.pop("shared_top_ns")
        attributed = _time(innermost_sums)
        projected = _time(top_sums) - shared_top + outside_top
        total = sums["total_gpu_ns"]
        conserved = (
            attributed + sums["unattributed_gpu_ns"] == total
            and projected + sums["projection_unattributed_gpu_ns"] == total
        )
        return GpuTotals(
            attributed_gpu_ns=attributed,
            projection_attributed_gpu_ns=projected,
            gpu_time_conserved=conserved,
            **sums,
        )


class _Covered:
    """The merged blocks of a timeline's ranges, and the time of intervals inside them."""

    def __init__(self, timeline: pl.DataFrame) -> None:
        blocks = busy_blocks(
            timeline.select(pl.lit("").alias("device"), "start_ns", "end_ns").filter(
                pl.col("end_ns") > pl.col("start_ns")
            )
        )
        lengths = blocks["end_ns"] - blocks["start_ns"]
        self._block_start = blocks["start_ns"]
        self._block_end = blocks["end_ns"]
        self._before = lengths.cum_sum() - lengths  # covered time before each block

    def _covered_before(self, instants: pl.Series) -> pl.Series:
        """Covered time (inside a timeline range) before each instant."""
        k = self._block_start.search_sorted(instants, side="right").cast(pl.Int64) - 1
        safe = k.clip(lower_bound=0)
        frame = pl.DataFrame(
            {
                "t": instants,
                "k": k,
                "start": self._block_start.gather(safe),
                "end": self._block_end.gather(safe),
                "before": self._before.gather(safe),
            }
        )
        inside = pl.min_horizontal("t", "end") - pl.col("start")
        return frame.select(
            pl.when(pl.col("k") >= 0).then(pl.col("before") + inside).otherwise(0)
        ).to_series()

    def covered_ns(self, ops: pl.DataFrame) -> int:
        """Time of these operations inside the timeline's ranges (prefix sums over its blocks)."""
        if ops.is_empty() or self._block_start.is_empty():
            return 0
        covered = self._covered_before(ops["end_ns"]) - self._covered_before(ops["start_ns"])
        return int(covered.sum() or 0)


def _escaping(proj_ranges: pl.DataFrame) -> pl.Series:
    """Deeper ranges not inside the top-level range of their thread that starts last before them."""
    top = (
        proj_ranges.filter(pl.col("level") == 0)
        .select(
            *THREAD, pl.col("start_ns").alias("top_start_ns"), pl.col("end_ns").alias("top_end_ns")
        )
        .sort("top_start_ns")
    )
    deeper = proj_ranges.filter(pl.col("level") > 0).select("rid", *THREAD, "start_ns", "end_ns")
    if deeper.is_empty():
        return deeper["rid"]
    return (
        deeper.sort("start_ns")
        .join_asof(
            top,
            left_on="start_ns",
            right_on="top_start_ns",
            by=list(THREAD),
            strategy="backward",
            check_sortedness=False,  # both sorted by start just above
        )
        .filter(pl.col("top_end_ns").is_null() | (pl.col("top_end_ns") < pl.col("end_ns")))["rid"]
    )


def _touching(top: pl.DataFrame) -> bool:
    """Whether two top-level ranges of one thread share an instant (one ends as the next starts)."""
    ordered = top.sort([*THREAD, "start_ns", "end_ns"])
    previous_end = pl.col("end_ns").shift(1).over(list(THREAD))
    return bool(ordered.select((pl.col("start_ns") == previous_end).any()).item())


def conservation_warnings(gpu: GpuTotals) -> list[str]:
    """One line per scheme whose sides do not add up to the operations' total."""
    out: list[str] = []
    sides = (
        ("window", gpu.attributed_gpu_ns, gpu.unattributed_gpu_ns, "inside no phase"),
        (
            "projection",
            gpu.projection_attributed_gpu_ns,
            gpu.projection_unattributed_gpu_ns,
            "launched inside no range",
        ),
    )
    for scheme, attributed, unattributed, where in sides:
        gap = attributed + unattributed - gpu.total_gpu_ns
        if gap:
            out.append(
                f"GPU time not conserved under {scheme} attribution: its phases hold "
                f"{attributed:,} ns and {unattributed:,} ns lies {where}, but the operations "
                f"total {gpu.total_gpu_ns:,} ns ({gap:+,} ns) — please report this trace"
            )
    return out
