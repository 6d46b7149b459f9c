"""VeRL's logged memory per step (``memory_per_step.csv`` of ``nvtx-phases logs``).

VeRL logs, per step, ``perf/max_memory_allocated_gb`` and ``perf/max_memory_reserved_gb``
(``torch.cuda.max_memory_allocated/reserved`` / 1024**3 on the logging worker, peaks since the
last reset) and ``perf/cpu_memory_used_gb`` (the process's resident memory); some releases log
the actor's as ``actor/perf/…``. :func:`memory_per_step` is a pure function from the parsed
log values (:func:`analysis.workload.verl_logs.latest_values`) to the table, for ``logs`` and
for any command that reads a VeRL log beside a trace.
"""

from __future__ import annotations

import re

import polars as pl

#: VeRL's per-step memory metrics (``perf/``, GB as VeRL computes them: bytes / 1024**3)
#: (``perf/…`` from the trainer, ``actor/perf/…`` from the actor's update: ``prefix`` says which)
MEMORY_KEYS = ("max_memory_allocated_gb", "max_memory_reserved_gb", "cpu_memory_used_gb")
MEMORY_SCHEMA = {"step": pl.Int64, "prefix": pl.String, **dict.fromkeys(MEMORY_KEYS, pl.Float64)}
_MEMORY_KEY = re.compile(r"^((?:[^/]+/)*)perf/(" + "|".join(MEMORY_KEYS) + r")$")
_DEVICE_MEMORY = ("max_memory_allocated_gb", "max_memory_reserved_gb")


def memory_per_step(values: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """One row per (step, key prefix) of VeRL's logged memory (:data:`MEMORY_SCHEMA`), and notes.

    ``prefix``: what precedes ``perf/`` in the key (``""`` or ``"actor/"``). ``values``: :func:`latest_values` of the log. A metric a step did not log is null. A step
    whose device metrics are both logged as 0 (torch's counters on a run without a GPU, as
    VeRL's CPU run logs them) has them null, with a note: 0 there is no measurement. The
    frame is empty when no step logged any memory metric.
    """
    rows = values.filter(pl.col("key").str.contains(_MEMORY_KEY.pattern))
    if rows.is_empty():
        return pl.DataFrame(schema=MEMORY_SCHEMA), []
    wide = (
        rows.with_columns(
            pl.col("key").str.extract(_MEMORY_KEY.pattern, 1).alias("prefix"),
            pl.col("key").str.extract(_MEMORY_KEY.pattern, 2),
        )
        .pivot(on="key", index=["step", "prefix"], values="value", aggregate_function="last")
        .sort("step", "prefix")
    )
    for name in MEMORY_SCHEMA:
        if name not in wide.columns:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Float64).alias(name))
    wide = wide.select(list(MEMORY_SCHEMA)).cast(MEMORY_SCHEMA)  # type: ignore[arg-type]
    zero = (pl.col(_DEVICE_MEMORY[0]) == 0) & (pl.col(_DEVICE_MEMORY[1]) == 0)
    zeroed = wide.filter(zero.fill_null(False))["step"].unique().to_list()
    notes = []
    if zeroed:
        wide = wide.with_columns(
            pl.when(zero.fill_null(False)).then(None).otherwise(pl.col(c)).alias(c)
            for c in _DEVICE_MEMORY
        )
        notes.append(
            f"{len(zeroed)} step(s) logged perf/max_memory_allocated_gb and "
            "perf/max_memory_reserved_gb as 0 (no GPU): left null in memory_per_step.csv"
        )
    return wide, notes
