"""Tables and figures written beside an analysis when its data allow them.

The power envelope (with power samples) and GPU metrics per phase (with nsys GPU metrics).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from analysis.jobs.common import Reporter

if TYPE_CHECKING:
    from analysis.model import Analysis


def envelope_files(
    result: Analysis, out: Path, *, table: bool, figure: bool, saved: Path | None = None
) -> tuple[list[Path], list[Path]]:
    """Write ``power_envelope.csv`` (``table``) and ``figures/power_envelope.*`` (``figure``).

    Nothing without power samples. ``saved``: an analysis folder whose ``power_envelope.csv``
    the figure is drawn from (seconds saved at 1,000 steps), when it has one and no table is
    asked for. Returns (tables written, figures written).
    """
    if result.power_samples is None or result.power_samples.is_empty():
        return [], []  # before the imports: numpy is not needed then (start-up)
    from analysis.energy.envelope import ENVELOPE_SCHEMA, power_envelope
    from analysis.render.envelope import CSV_NAME, power_envelope_figure, write_envelope_csv

    if saved is not None and not table and (saved / CSV_NAME).is_file():
        import polars as pl

        saved_table = pl.read_csv(saved / CSV_NAME, schema_overrides=ENVELOPE_SCHEMA)
        return [], power_envelope_figure(saved_table, out / "figures") if figure else []
    envelope = power_envelope(result)
    if envelope is None:
        return [], []
    tables = write_envelope_csv(envelope, out) if table else []
    return tables, power_envelope_figure(envelope, out / "figures") if figure else []


def gpu_metrics_files(result: Analysis, out: Path, reporter: Reporter) -> list[Path]:
    """Write ``gpu_metrics_per_phase.csv`` when the exports hold nsys GPU metrics (a note else).

    Only on a fresh analysis: one read back from a folder lacks the per-operation columns.
    """
    from analysis.aggregate.gpu_metrics import gpu_metrics_per_phase, projection_devices
    from analysis.read.gpu_metrics import read_run_gpu_metrics
    from analysis.render.gpu_metrics import write_gpu_metrics_csv

    metrics = read_run_gpu_metrics(result.summary.traces)
    for note in metrics.notes:
        reporter.note(note)
    table = gpu_metrics_per_phase(
        result.phases,
        metrics.samples(),
        metrics.available,
        projection_devices(result.gpu_activity, result.phases),
    )
    return write_gpu_metrics_csv(table, out)
