"""The per-operation table: every GPU operation with its step and phase under each scheme."""

from __future__ import annotations

import polars as pl

from ..intervals import window_at


def gpu_activity(
    ops: pl.DataFrame,
    pairs: pl.DataFrame,
    pieces: pl.DataFrame,
    phases: pl.DataFrame,
    steps: pl.DataFrame,
) -> pl.DataFrame:
    """Every GPU operation with its step and phase path under each scheme (null: unattributed)."""
    info = phases.select("rid", "path", "step", "level")
    innermost_proj = (
        pairs.join(info, on="rid")
        # deepest range; between ranges of one level (start/end ranges that do not nest), the
        # one that started last (rids follow start order on a thread)
        .sort(["op_id", "level", "rid"], descending=[False, True, True])
        .unique(subset="op_id", keep="first")
        .select(
            "op_id",
            pl.col("path").alias("projection_path"),
            pl.col("step").alias("projection_step"),
        )
    )
    at_start = (
        pieces.filter(pl.col("first_piece"))
        .select("op_id", "rid")
        .join(info, on="rid", how="left")
        .select(
            "op_id",
            pl.col("path").alias("window_path"),
            pl.col("step").alias("window_step_of_phase"),
        )
    )
    owners = (
        pieces.filter(pl.col("overlap_ns") > 0)
        .group_by("op_id")
        .agg((pl.col("rid").n_unique() > 1).alias("window_split"))
    )
    activity = (
        ops.join(innermost_proj, on="op_id", how="left")
        .join(at_start, on="op_id", how="left")
        .join(owners, on="op_id", how="left")
    )
    if steps.height:
        # the step window containing each start (the same rule as the ranges' steps)
        windows = steps.sort("step_start_ns", "step")
        activity = activity.with_columns(window_at(windows, activity["start_ns"]).alias("step"))
    else:
        activity = activity.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    return activity.select(
        "op_id",
        "trace",
        "pid",
        pl.col("gtid").alias("launch_gtid"),
        "device",
        "stream",
        "kind",
        pl.col("op_class").cast(pl.String),
        "name",
        "start_ns",
        "end_ns",
        (pl.col("end_ns") - pl.col("start_ns")).alias("dur_ns"),
        "bytes",
        "correlation_id",
        "projection_step",
        "projection_path",
        pl.coalesce("window_step_of_phase", "step").alias("window_step"),
        "window_path",
        pl.col("window_split").fill_null(False),
    ).sort("op_id")


def operation_counts() -> list[pl.Expr]:
    """Counts and times per kind of operation over ``gpu_activity`` rows (the summary's fields).

    ``n_gpu_ops, n_kernels, kernel_ns, nccl_ns, memcpy_ns, memcpy_bytes, memset_ns, graph_ns,
    n_graphs``.
    """
    kind, dur = pl.col("kind"), pl.col("dur_ns")
    return [
        pl.len().alias("n_gpu_ops"),
        (kind == "kernel").sum().alias("n_kernels"),
        dur.filter(kind == "kernel").sum().alias("kernel_ns"),
        dur.filter(pl.col("op_class") == "nccl").sum().alias("nccl_ns"),
        dur.filter(kind == "memcpy").sum().alias("memcpy_ns"),
        pl.col("bytes").filter(kind == "memcpy").sum().alias("memcpy_bytes"),
        dur.filter(kind == "memset").sum().alias("memset_ns"),
        dur.filter(kind == "graph").sum().alias("graph_ns"),
        (kind == "graph").sum().alias("n_graphs"),
    ]
