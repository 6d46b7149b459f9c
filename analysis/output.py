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
        atomic_write(out / "gpu_activity.parquet", _activity_writer(analysis.gpu_activity)),
        atomic_write(
            out / "kernels.csv",
            analysis.kernels.with_columns(pl.col("op_class").cast(pl.String)).write_csv,
        ),
        atomic_write(out / "steps.csv", analysis.steps.write_csv),
        *(
            [atomic_write(out / "power_samples.parquet", analysis.power_samples.write_parquet)]
            if analysis.power_samples is not None
            else []
        ),
        atomic_write(
            out / "summary.json",
            lambda p: p.write_text(json.dumps(analysis.summary, indent=2) + "\n", encoding="utf-8"),
        ),
    ]
    return written


def _activity_writer(activity: pl.DataFrame | pl.LazyFrame) -> Callable[[Path], None]:
    # a big run's activity is a lazy scan of per-bucket parts: stream it, never collect it
    if isinstance(activity, pl.LazyFrame):
        return lambda path: activity.sink_parquet(path)
    return activity.write_parquet


def load_analysis(folder: str | Path) -> Analysis:
    """Read back what :func:`write_outputs` wrote (of GPU activity, only pid, device, dur_ns)."""
    folder = Path(folder)
    required = (
        "phases.parquet",
        "phase_devices.parquet",
        "kernels.csv",
        "steps.csv",
        "summary.json",
    )
    missing = [name for name in required if not (folder / name).exists()]
    if missing:
        from analysis.errors import AnalysisError

        msg = f"{folder}: not an analysis folder (missing {', '.join(missing)}); run `nvtx-phases analyze` first"
        raise AnalysisError(msg)
    power = folder / "power_samples.parquet"
    return Analysis(
        phases=pl.read_parquet(folder / "phases.parquet"),
        phase_devices=pl.read_parquet(folder / "phase_devices.parquet"),
        # only what per-rank questions need: the full table can be millions of rows
        gpu_activity=pl.read_parquet(
            folder / "gpu_activity.parquet", columns=["pid", "device", "dur_ns"]
        )
        if (folder / "gpu_activity.parquet").exists()
        else pl.DataFrame(),
        kernels=pl.read_csv(folder / "kernels.csv"),
        steps=pl.read_csv(folder / "steps.csv"),
        summary=json.loads((folder / "summary.json").read_text(encoding="utf-8")),
        warnings=json.loads((folder / "summary.json").read_text(encoding="utf-8")).get(
            "warnings", []
        ),
        power_samples=pl.read_parquet(power) if power.exists() else None,
    )
