"""Tables and figures written beside an analysis when its data allow them.

The power envelope (with power samples), GPU metrics per phase (with nsys GPU metrics) and
the report's response-length sections (with length records).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .common import Reporter

if TYPE_CHECKING:
    from ..model import Analysis
    from ..render.drawing import Drawing
    from ..render.report_units import Section


def envelope_files(
    result: Analysis,
    out: Path,
    *,
    table: bool,
    drawing: Drawing | None,
    saved: Path | None = None,
) -> list[Path]:
    """Write ``power_envelope.csv`` (``table``); give ``drawing`` ``figures/power_envelope.*``.

    Nothing without power samples. ``saved``: an analysis folder whose ``power_envelope.csv``
    the figure is drawn from (seconds saved at 1,000 steps), when it has one and no table is
    asked for. Returns the tables written (the figure's files come from ``drawing``).
    """
    if result.power_samples is None or result.power_samples.is_empty():
        return []  # before the imports: numpy is not needed then (start-up)
    from ..energy.envelope import ENVELOPE_SCHEMA, power_envelope
    from ..render.envelope import CSV_NAME, write_envelope_csv
    from ..render.figure_tasks import envelope_task

    if saved is not None and not table and (saved / CSV_NAME).is_file():
        import polars as pl

        if drawing is not None:
            saved_table = pl.read_csv(saved / CSV_NAME, schema_overrides=ENVELOPE_SCHEMA)
            drawing.draw(envelope_task(saved_table, out / "figures"))
        return []
    envelope = power_envelope(result)
    if envelope is None:
        return []
    if drawing is not None:
        drawing.draw(envelope_task(envelope, out / "figures"))
    return write_envelope_csv(envelope, out) if table else []


def gpu_metrics_files(result: Analysis, out: Path, reporter: Reporter) -> list[Path]:
    """Write ``gpu_metrics_per_phase.csv`` when the exports hold nsys GPU metrics (a note else).

    Only on a fresh analysis: one read back from a folder lacks the per-operation columns.
    """
    from ..aggregate.gpu_metrics import gpu_metrics_per_phase, projection_devices
    from ..normalize.gpu_metrics import read_run_gpu_metrics
    from ..render.gpu_metrics import write_gpu_metrics_csv

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


def length_sections(
    result: Analysis, length_dir: Path, cap: int | None, figures: Path, drawing: Drawing
) -> tuple[list[Section], list[str]]:
    """The report's length, straggler and energy-per-token sections, and what to warn of.

    The figures go to ``drawing`` with the cap used (given, or inferred from the records); the
    warnings name length records of steps the run lacks and run steps without records.
    """
    from ..render.figure_tasks import length_figure_tasks
    from ..workload.lengths import read_packed_lengths
    from ..workload.stragglers import run_lengths

    responses = read_packed_lengths([length_dir])
    tables = run_lengths(result, responses, cap)
    for task in length_figure_tasks(responses, tables.tails, figures, tables.cap.value):
        drawing.draw(task)
    sections: list[Section] = [
        ("Response lengths per step", tables.stats),
        ("Rollout stragglers", tables.tails),
        ("Energy per generated token", tables.energy),
    ]
    return sections, list(tables.warnings)
