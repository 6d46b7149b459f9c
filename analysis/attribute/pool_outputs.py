"""The outputs of a run's GPU pools: per-pool balance, pool columns, idle causes, what is missing.

:func:`attribute_buckets` attributes each pool's window phases on its own timeline; this module
turns its sums into what a run with pools adds (``pools.csv``, ``pool`` columns,
``idle_causes.csv``, the GPU figures of rows whose work was not captured). A run without pools
gets none of it, and its outputs are those of a colocated run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import polars as pl

from ..model import WINDOW
from . import operations as attribute
from .conservation import TIME_COLUMNS, RunTotals
from .idle_causes import idle_by_cause
from .not_captured import not_captured
from .pools import PROCESS_DEVICE_SCHEMA, PROCESS_NAME_SCHEMA, Pools

NO_PROCESSES = pl.DataFrame(schema={"trace": pl.String, "pid": pl.Int64})


@dataclass(frozen=True)
class PoolInputs:
    """What :func:`~analysis.attribute.pools.resolve_pools` reads besides the phase ranges.

    ``marks``: the run's NVTX marks (pool marks among them); ``process_devices``: ``trace, pid,
    device`` of every GPU each process's operations ran on; ``process_names``: ``trace, pid,
    process_name``; ``given``: the user's pools (name → patterns), or None.
    """

    marks: pl.DataFrame
    process_devices: pl.DataFrame = dataclasses.field(
        default_factory=lambda: pl.DataFrame(schema=PROCESS_DEVICE_SCHEMA)
    )
    process_names: pl.DataFrame = dataclasses.field(
        default_factory=lambda: pl.DataFrame(schema=PROCESS_NAME_SCHEMA)
    )
    given: Mapping[str, tuple[str, ...]] | None = None


@dataclass(frozen=True)
class PoolOutputs:
    """What a run with pools adds: the phase table with its GPU figures checked, and more."""

    #: the phase table (with pools: its ``pool`` column, rows not captured with null GPU figures)
    phases: pl.DataFrame
    #: :func:`pool_balance` (None: no pools)
    balance: pl.DataFrame | None = None
    #: :func:`~analysis.attribute.idle_causes.idle_by_cause` (None: no pools)
    idle_causes: pl.DataFrame | None = None
    warnings: tuple[str, ...] = ()


def pool_outputs(
    table: pl.DataFrame,
    ranges: pl.DataFrame,
    phases: pl.DataFrame,
    pools: Pools,
    layouts: attribute.WindowLayout,
    seg_sums: pl.DataFrame,
    totals: RunTotals,
    pool_inputs: PoolInputs | None,
) -> PoolOutputs:
    """The pool tables of a run with pools; for a run without, the phase table as it is.

    ``table``: the phase table (with ``pool``); ``ranges``: every NVTX range; ``phases``: the
    phase ranges; ``seg_sums``: the per-(segment, GPU) window sums with each segment's
    innermost range; ``pool_inputs``: its ``process_devices`` tell which processes ran
    operations.
    """
    balance = pool_balance(pools, layouts, seg_sums, totals)
    if balance is None:
        return PoolOutputs(table)
    checked, missing = not_captured(
        table,
        ranges,
        pools.members,
        pools.devices,
        dict(zip(balance["pool"], balance["total_gpu_ns"].fill_null(0), strict=True)),
        pool_inputs.process_devices if pool_inputs is not None else NO_PROCESSES,
    )
    idle = idle_by_cause(
        layouts,
        seg_sums,
        phases,
        not_captured=balance.filter(~pl.col("captured"))["pool"].to_list(),
    )
    return PoolOutputs(checked, balance, idle, (*pool_warnings(balance), *missing))


def pool_balance(
    pools: Pools,
    layouts: attribute.WindowLayout,
    seg_sums: pl.DataFrame,
    totals: RunTotals,
) -> pl.DataFrame | None:
    """Per pool: its GPUs, processes and window GPU time balance; None for a run without pools.

    ``total_gpu_ns`` and ``unattributed_gpu_ns`` from the operations on the pool's GPUs as
    read (outside every window range of the pool: :class:`RunTotals`), ``attributed_gpu_ns``
    from the per-segment sums of the pool's segments that have an innermost range (what its
    rows are built from); ``gpu_time_conserved``: the two add up to the total.
    """
    if not pools.split:
        return None
    segment_pool = pl.concat(
        [
            pl.DataFrame(
                {
                    "seg": pl.int_range(
                        t.seg_offset, t.seg_offset + t.boundaries.len() + 1, eager=True
                    ),
                    "pool": t.pool,
                }
            )
            for t in layouts
        ]
    ).cast({"seg": pl.Int64})
    held = seg_sums.filter(pl.col("rid").is_not_null()).join(segment_pool, on="seg")
    attributed = held.group_by("pool").agg(
        pl.sum_horizontal(*TIME_COLUMNS).sum().alias("attributed_gpu_ns")
    )
    sums = pl.DataFrame(
        [(pool, total, rest) for pool, (total, rest) in totals.pool_sums.items()],
        schema={"pool": pl.String, "total_gpu_ns": pl.Int64, "unattributed_gpu_ns": pl.Int64},
        orient="row",
    )
    return (
        pools.table()
        .join(sums, on="pool", how="left")
        .join(attributed, on="pool", how="left")
        .with_columns(pl.col("attributed_gpu_ns").fill_null(0).cast(pl.Int64))
        .with_columns(
            (
                pl.col("attributed_gpu_ns") + pl.col("unattributed_gpu_ns")
                == pl.col("total_gpu_ns")
            ).alias("gpu_time_conserved"),
            # no operation on the pool's GPUs (or no GPU): its GPU time unknown, not 0
            (pl.col("total_gpu_ns").fill_null(0) > 0).alias("captured"),
        )
        .with_columns(
            pl.when(pl.col("captured")).then(pl.col(c)).alias(c)
            for c in (
                "total_gpu_ns",
                "attributed_gpu_ns",
                "unattributed_gpu_ns",
                "gpu_time_conserved",
            )
        )
        .select(
            "pool",
            "source",
            "n_devices",
            "devices",
            "processes",
            "captured",
            "total_gpu_ns",
            "attributed_gpu_ns",
            "unattributed_gpu_ns",
            "gpu_time_conserved",
        )
    )


def pool_warnings(balance: pl.DataFrame | None) -> list[str]:
    """One line per pool whose window GPU time does not add up."""
    if balance is None:
        return []
    return [
        f"GPU time not conserved in pool {r['pool']}: its phases hold {r['attributed_gpu_ns']:,} "
        f"ns and {r['unattributed_gpu_ns']:,} ns lies inside none of them, but its GPUs' "
        f"operations total {r['total_gpu_ns']:,} ns — please report this trace"
        for r in balance.filter(~pl.col("gpu_time_conserved").fill_null(True)).iter_rows(named=True)
    ]


def with_pool(phases: pl.DataFrame, pools: Pools, layouts: attribute.WindowLayout) -> pl.DataFrame:
    """``phases`` with ``pool``, only in a run with pools.

    A window range's pool is its timeline's; a projection range's its process's (null when its
    process is in none).
    """
    if not pools.split:
        return phases
    timeline_pool = pl.concat(
        [t.ranges.select("rid", pl.lit(t.pool).alias("pool")) for t in layouts]
    )
    process_pool = pools.members.rename({"pool": "_process_pool"})
    return (
        phases.join(timeline_pool, on="rid", how="left")
        .join(process_pool, on=["trace", "pid"], how="left")
        .with_columns(
            pl.when(pl.col("attribution") == WINDOW)
            .then(pl.col("pool"))
            .otherwise(pl.col("_process_pool"))
            .alias("pool")
        )
        .drop("_process_pool")
    )
