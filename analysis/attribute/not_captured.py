"""Pool phases whose GPU work was not captured: said, and left empty, never shown as 0 % busy.

Rollout kernels are often missing from traces (VeRL issue #4575: nsys records no rollout kernel
while ``update_actor``'s are there; vLLM's engine processes and CUDA-graph replays outside what
nsys traced). In a run with GPU pools a window phase row of pool ``P`` is **not captured** when

- ``P`` has no GPU in the capture, or no captured operation on its GPUs at all (its processes'
  operations were not traced), or
- no operation of ``P``'s GPUs lies in the row's interval, while a process of ``P`` that has
  no captured operation in the whole capture had an NVTX range open in it (a traced server
  whose kernels were not: CUDA graphs, engine subprocesses), or ``P``'s GPUs drew more than
  :data:`ACTIVE_ABOVE_IDLE_W` above idle on average in it (power says they worked).

A run none of whose pools has a GPU (a CPU-only capture) has nothing missing. A CPU phase of a
traced pool (a reward function, the advantage) stays a measured 0 % busy: its
GPUs' operations were captured elsewhere and nothing says they worked then.

Such a row's GPU figures are null (:data:`GPU_FIGURES`), its ``kernels_captured`` false, and a
warning names the pool, its processes without operations, and the options that capture them.
"""

from __future__ import annotations

import polars as pl

from ..aggregate.phases import SUMMED_METRICS
from ..intervals import union_blocks
from ..model import WINDOW
from .pools import UNPOOLED

#: mean power per GPU above idle that says a GPU worked (W): idle H100/A100 draw 50–90 W, a
#: decoding GPU hundreds; sampling noise stays within a few watts
ACTIVE_ABOVE_IDLE_W = 20.0
#: the phase-table columns that come from GPU operations (null when they were not captured)
GPU_FIGURES: tuple[str, ...] = (
    "gpu_busy_ns",
    "idle_ns",
    *SUMMED_METRICS,
    "gpu_start_ns",
    "gpu_end_ns",
)
#: how to capture the missing work (nsys and VeRL options)
CAPTURE_HINT = (
    "trace the processes that run the pool's GPU work (an inference server started outside "
    "nsys's process tree is not traced: start it under nsys, or use nsys "
    "--trace-fork-before-exec=true for forked engine processes), and trace CUDA-graph "
    "replays kernel by kernel with --cuda-graph-trace=node; in VeRL, profile the rollout "
    "servers too (actor_rollout_ref.rollout.profiler / global_profiler with tool nsys)"
)


def not_captured(
    table: pl.DataFrame,
    ranges: pl.DataFrame,
    members: pl.DataFrame,
    pool_devices: dict[str, tuple[str, ...]],
    pool_gpu_ns: dict[str, int],
    launching: pl.DataFrame,
) -> tuple[pl.DataFrame, list[str]]:
    """``table`` (phase rows with ``pool``) with GPU figures null where not captured; warnings.

    ``ranges``: every NVTX range of the run (``trace, pid, start_ns, end_ns``); ``members``:
    ``trace, pid, pool``; ``pool_devices``: each pool's GPUs; ``pool_gpu_ns``: the GPU time of
    each pool's captured operations; ``launching``: ``trace, pid`` of the processes with
    captured operations.
    """
    if not any(pool_devices.values()):  # a CPU-only run: no GPU to be missing (rows show "—")
        return table.with_columns(pl.lit(True).alias("kernels_captured")), []
    window = (pl.col("attribution") == WINDOW) & pl.col("pool").is_not_null()
    # the unpooled driver processes have no GPU by construction: nothing is missing there
    silent = [
        p
        for p, devices in pool_devices.items()
        if p != UNPOOLED and (not devices or not pool_gpu_ns.get(p))
    ]
    without_ops = members.join(launching.select("trace", "pid"), on=["trace", "pid"], how="anti")
    evidence = _nvtx_evidence(table, window, ranges, without_ops)
    above = (
        pl.col("energy_above_idle_j") * 1e9 / (pl.col("wall_ns") * pl.col("n_devices"))
        > ACTIVE_ABOVE_IDLE_W
        if "energy_above_idle_j" in table.columns
        else pl.lit(False)
    )
    flagged = (
        table.with_row_index("_row")
        .join(evidence, on="_row", how="left")
        .with_columns(
            (
                window
                & (
                    pl.col("pool").is_in(silent)
                    | (
                        (pl.col("gpu_busy_ns") == 0)
                        & (pl.col("wall_ns") > 0)
                        & (pl.col("_active").fill_null(False) | above.fill_null(False))
                    )
                )
            ).alias("_missing")
        )
    )
    columns = [c for c in GPU_FIGURES if c in table.columns]
    out = flagged.with_columns(
        *(pl.when(pl.col("_missing")).then(None).otherwise(pl.col(c)).alias(c) for c in columns),
        (~pl.col("_missing")).alias("kernels_captured"),
    )
    warnings = _warnings(out.filter(pl.col("_missing")), members, pool_devices, pool_gpu_ns)
    return out.drop("_row", "_active", "_missing"), warnings


def _nvtx_evidence(
    table: pl.DataFrame, window: pl.Expr, ranges: pl.DataFrame, without_ops: pl.DataFrame
) -> pl.DataFrame:
    """``_row, _active``: window rows while a pool process without operations had a range open."""
    empty = pl.DataFrame(schema={"_row": pl.UInt32, "_active": pl.Boolean})
    if table.is_empty() or ranges.is_empty() or without_ops.is_empty():
        return empty
    blocks = union_blocks(
        ranges.join(without_ops, on=["trace", "pid"]).filter(pl.col("end_ns") > pl.col("start_ns")),
        ["pool", "trace", "pid"],
    )
    return (
        table.with_row_index("_row")
        .filter(window)
        .select("_row", "pool", "trace", "pid", "start_ns", "end_ns")
        .join(
            blocks.rename({"trace": "o_trace", "pid": "o_pid", "start_ns": "o_s", "end_ns": "o_e"}),
            on="pool",
        )
        .filter(
            ((pl.col("o_trace") != pl.col("trace")) | (pl.col("o_pid") != pl.col("pid")))
            & (pl.col("o_s") < pl.col("end_ns"))
            & (pl.col("o_e") > pl.col("start_ns"))
        )
        .select("_row", pl.lit(True).alias("_active"))
        .unique("_row")
    )


def _warnings(
    missing: pl.DataFrame,
    members: pl.DataFrame,
    pool_devices: dict[str, tuple[str, ...]],
    pool_gpu_ns: dict[str, int],
) -> list[str]:
    out = []
    for pool, rows in missing.group_by("pool", maintain_order=True):
        name = str(pool[0])
        phases = ", ".join(sorted(set(rows["phase"].to_list()))[:6])
        processes = members.filter(pl.col("pool") == name).sort("trace", "pid")
        listed = ", ".join(f"{t} pid {p}" for t, p in processes.select("trace", "pid").rows()[:6])
        if not pool_devices.get(name):
            what = f"pool {name} has no GPU operation in the capture (no GPU of it is known)"
        elif not pool_gpu_ns.get(name):
            what = (
                f"pool {name}'s GPUs ({', '.join(pool_devices[name][:4])}) ran no captured "
                "operation in the whole capture"
            )
        else:
            what = (
                f"pool {name}'s GPUs ({', '.join(pool_devices[name][:4])}) hold "
                f"{pool_gpu_ns.get(name, 0) / 1e9:.3f} s of captured operations, none inside "
                f"{rows.height} of its phase row(s) though its processes were active (NVTX or "
                "power)"
            )
        out.append(
            f"GPU work not captured: {what}; {rows.height} phase row(s) ({phases}) have their GPU "
            f"figures left empty, not 0. Processes of the pool: {listed or 'none'}. To capture "
            f"it: {CAPTURE_HINT}"
        )
    return out
