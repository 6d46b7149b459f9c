"""The idle power baseline: each GPU's power while it ran nothing, from the run's busy stretches.

``energy_above_idle_j`` subtracts it; samples within a guard of any operation are left out, since
NVML's readings trail the work (see :func:`idle_guard_ns`).
"""

from __future__ import annotations

import polars as pl

from ..frames import previous_and_next
from ..intervals import union_blocks


def idle_guard_ns(interval_ns: int | None) -> int:
    """How far from any GPU operation a sample must be to count as idle."""
    return max(10 * (interval_ns or 0), 1_000_000)


def busy_blocks(intervals: pl.DataFrame, *, merge_gap_ns: int = 0) -> pl.DataFrame:
    """Busy stretches per device (``device, start_ns, end_ns``).

    Intervals merge when they overlap, touch, or lie less than ``merge_gap_ns`` apart
    (:func:`~analysis.intervals.union_blocks`).

    With ``merge_gap_ns = 2 × idle_guard_ns`` the blocks are few (one per idle stretch), and
    merging blocks of parts of a run gives the blocks of the whole run.
    """
    return union_blocks(intervals, ["device"], gap_ns=max(merge_gap_ns, 1))


def idle_baseline(
    cum: pl.DataFrame, blocks: pl.DataFrame, *, interval_ns: int | None
) -> pl.DataFrame:
    """Median power per device over samples taken in long GPU-idle stretches: ``idle_power_w``.

    A sample counts as idle when no operation runs on its device for at least
    max(10 sampling intervals, 1 ms) around it, so gaps between kernels inside a busy phase do
    not count. Devices with fewer than 5 such samples, or with no operation at all, get null
    (then pass ``--idle-power-w``).
    ``blocks``: :func:`busy_blocks` of the run's operations (merged up to 2 × that guard, which
    changes no sample's verdict: a gap shorter than two guards holds no idle sample).
    """
    guard = idle_guard_ns(interval_ns)
    busy = blocks.sort("start_ns")
    samples = cum.select("device", "t_ns", "power_w").sort("t_ns")
    both = previous_and_next(
        samples,
        busy,
        left_on="t_ns",
        right_on="start_ns",
        before={"start_ns": "prev_start", "end_ns": "prev_end"},
        after={"start_ns": "next_start", "end_ns": "next_end"},
    )
    idle = both.filter(
        (pl.col("prev_end").is_null() | (pl.col("t_ns") - pl.col("prev_end") >= guard))
        & (pl.col("next_start").is_null() | (pl.col("next_start") - pl.col("t_ns") >= guard))
    )
    stats = idle.group_by("device").agg(
        pl.col("power_w").median().alias("idle_power_w"), pl.len().alias("n")
    )
    # a GPU that ran no captured operation: its idle cannot be told from work the capture
    # missed (an untraced inference server), so its baseline is unknown, not its median power
    traced = pl.col("device").is_in(busy["device"].unique().implode())
    return (
        cum.select("device")
        .unique()
        .join(stats, on="device", how="left")
        .with_columns(
            pl.when((pl.col("n") >= 5) & traced).then(pl.col("idle_power_w")).alias("idle_power_w")
        )
        .select("device", "idle_power_w")
        .sort("device")
    )
