"""The GPU metrics per phase table (:mod:`analysis.aggregate.gpu_metrics`) as a CSV file.

Nothing here computes: the table is written as it is, statistics to 3 decimals; a row with no
sample keeps ``n_samples`` 0 and empty statistics.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .atomic import atomic_write

CSV_NAME = "gpu_metrics_per_phase.csv"


def write_gpu_metrics_csv(table: pl.DataFrame, out: str | Path) -> list[Path]:
    """Write ``out/gpu_metrics_per_phase.csv`` (atomically); nothing for an empty table."""
    if table.is_empty():
        return []
    return [atomic_write(Path(out) / CSV_NAME, lambda p: table.write_csv(p, float_precision=3))]
