"""Write an :class:`~analysis.pipeline.Analysis` to a folder, each file atomically.

Every file is written to a temporary name in the same folder and renamed into place, so an
interrupted run never leaves a half-written table, and re-running into the same folder replaces
each output whole.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import polars as pl

from analysis.pipeline import Analysis


def atomic_write(path: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_outputs(analysis: Analysis, out: str | Path) -> list[Path]:
    """Write phases (Parquet+CSV), per-device phases, GPU activity, kernels, steps and summary."""
    out = Path(out)
    written = [
        atomic_write(out / "phases.parquet", analysis.phases.write_parquet),
        atomic_write(out / "phases.csv", analysis.phases.write_csv),
        atomic_write(out / "phase_devices.parquet", analysis.phase_devices.write_parquet),
        atomic_write(out / "gpu_activity.parquet", analysis.gpu_activity.write_parquet),
        atomic_write(
            out / "kernels.csv",
            analysis.kernels.with_columns(pl.col("op_class").cast(pl.String)).write_csv,
        ),
        atomic_write(out / "steps.csv", analysis.steps.write_csv),
        atomic_write(
            out / "summary.json",
            lambda p: p.write_text(json.dumps(analysis.summary, indent=2) + "\n", encoding="utf-8"),
        ),
    ]
    return written
