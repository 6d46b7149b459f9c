"""Idle GPU time of each pool split by cause: what its GPUs were waiting for.

In asynchronous RL the pools wait on each other: the trainer for samples (starvation), the
rollouter for new weights (refit), for the trainer to catch up (staleness limit), at validation.
Over a pool's span (first start to last end of its window ranges) every elementary segment of its
window timeline (:class:`~analysis.attribute.operations.PoolTimeline`) is idle for
``length × |GPUs| − busy`` (busy: the union of the pool's operations per GPU inside the segment,
summed over its GPUs), and that idle time has the cause of the segment's innermost range
(:data:`CAUSE_OF_PHASE`; a segment inside none of the pool's ranges: ``no_phase``). A pool's
causes add up to its idle time over its span.

``gen`` is the trainer's wait on the rollouter's queue in VeRL's fully async trainer (it takes
samples, it generates none), so ``gen`` of the pool named ``trainer`` is starvation; ``gen`` of
any other pool is generation (``other``).
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from .operations import WindowLayout

#: the causes, in the order tables and figures list them
CAUSES: tuple[str, ...] = (
    "starvation",
    "refit",
    "partial_rollout_pause",
    "generation_limit",
    "validation",
    "other",
    "no_phase",
)
#: phase → the cause of the idle time inside it (every other phase: ``other``)
CAUSE_OF_PHASE: dict[str, str] = {
    "wait_for_enough_samples": "starvation",
    "param_sync": "refit",
    "update_weights": "refit",
    "weight_sync": "refit",
    "sync_rollout_weights": "refit",
    "partial_pause": "partial_rollout_pause",
    "staleness_wait": "generation_limit",
    "testing": "validation",
    "validate": "validation",
}
#: the pool whose ``gen`` is a wait for samples (VeRL's fully async trainer)
TRAINER_POOL = "trainer"

IDLE_CAUSE_SCHEMA = {
    "pool": pl.String,
    "step": pl.Int64,
    "cause": pl.String,
    "n_devices": pl.Int64,
    "wall_ns": pl.Int64,
    "gpu_busy_ns": pl.Int64,
    "idle_ns": pl.Int64,
}


def pool_segments(layouts: WindowLayout) -> pl.DataFrame:
    """``pool, seg, start_ns, end_ns, rid, n_devices`` of every segment inside a pool's span.

    ``seg`` numbered on the run (as the per-segment sums are); ``rid``: the innermost range
    (null: inside none of the pool's ranges).
    """
    parts = []
    for t in layouts:
        if t.boundaries.len() < 2:
            continue
        edges = t.boundaries.cast(pl.Int64)
        local = pl.DataFrame(
            {
                "seg": pl.int_range(1, edges.len(), eager=True, dtype=pl.Int64),
                "start_ns": edges[:-1],
                "end_ns": edges[1:],
            }
        ).join(t.innermost.cast({"seg": pl.Int64}), on="seg", how="left")
        parts.append(
            t.run_segments(local).with_columns(
                pl.lit(t.pool).alias("pool"),
                pl.lit(len(t.devices) if t.devices is not None else 0, dtype=pl.Int64).alias(
                    "n_devices"
                ),
            )
        )
    schema = {
        "seg": pl.Int64,
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
        "rid": pl.Int64,
        "pool": pl.String,
        "n_devices": pl.Int64,
    }
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat([p.select(list(schema)).cast(schema) for p in parts])  # type: ignore[arg-type]


def idle_by_cause(
    layouts: WindowLayout,
    seg_sums: pl.DataFrame,
    phases: pl.DataFrame,
    *,
    not_captured: Sequence[str] = (),
) -> pl.DataFrame:
    """Per ``(pool, step, cause)``: wall time, busy and idle GPU time (:data:`IDLE_CAUSE_SCHEMA`).

    ``seg_sums``: ``seg, device, gpu_busy_ns`` per (segment, GPU) of the run's window pieces;
    ``phases``: ``rid, canonical, step`` of the phase ranges. ``step`` is the innermost range's
    (a trainer step, or the rollouter's parameter version); null for ``no_phase`` time.
    ``not_captured``: pools whose GPU work the capture lacks: their busy and idle time null.
    """
    segments = pool_segments(layouts)
    busy = seg_sums.group_by("seg").agg(pl.col("gpu_busy_ns").sum())
    named = phases.select("rid", pl.col("canonical").alias("phase"), "step")
    cause = (
        pl.when(pl.col("rid").is_null())
        .then(pl.lit("no_phase"))
        .when((pl.col("phase") == "gen") & (pl.col("pool") == TRAINER_POOL))
        .then(pl.lit("starvation"))
        .otherwise(pl.col("phase").replace_strict(CAUSE_OF_PHASE, default="other"))
    )
    rows = (
        segments.join(busy, on="seg", how="left")
        .join(named, on="rid", how="left")
        .with_columns(
            pl.col("gpu_busy_ns").fill_null(0),
            (pl.col("end_ns") - pl.col("start_ns")).alias("wall_ns"),
            cause.alias("cause"),
        )
        .with_columns(
            (pl.col("wall_ns") * pl.col("n_devices") - pl.col("gpu_busy_ns")).alias("idle_ns")
        )
        .group_by("pool", "step", "cause")
        .agg(
            pl.col("n_devices").first(),
            pl.col("wall_ns").sum(),
            pl.col("gpu_busy_ns").sum(),
            pl.col("idle_ns").sum(),
        )
    )
    order = pl.col("cause").replace_strict(
        {c: i for i, c in enumerate(CAUSES)}, return_dtype=pl.Int64
    )
    unknown = pl.col("pool").is_in(list(not_captured))
    return (
        rows.with_columns(
            pl.when(~unknown).then(pl.col(c)).alias(c) for c in ("gpu_busy_ns", "idle_ns")
        )
        .sort(["pool", "step", order], nulls_last=True)
        .select(list(IDLE_CAUSE_SCHEMA))
        .cast(IDLE_CAUSE_SCHEMA)  # type: ignore[arg-type]
    )


def idle_totals(idle_causes: pl.DataFrame) -> pl.DataFrame:
    """``pool, cause, idle_ns, idle_share_pct``: each pool's idle GPU time by cause, all steps."""
    totals = idle_causes.group_by("pool", "cause").agg(pl.col("idle_ns").sum())
    order = pl.col("cause").replace_strict(
        {c: i for i, c in enumerate(CAUSES)}, return_dtype=pl.Int64
    )
    pool_idle = pl.col("idle_ns").sum().over("pool")
    return (
        totals.sort("pool", order)
        .with_columns(
            pl.when(pool_idle > 0).then(pl.col("idle_ns") / pool_idle * 100).alias("idle_share_pct")
        )
        .select("pool", "cause", "idle_ns", "idle_share_pct")
    )
