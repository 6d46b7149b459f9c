"""Figures and report sections drawn beside an analysis when its data allow them.

The power envelope figure (with power samples) and the report's response-length sections (with
length records); the tables themselves are the registry's (:mod:`analysis.render.outputs.tables`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model import Analysis
    from ..render.figures.drawing import Drawing
    from ..render.report.units import Section


def envelope_drawer(drawing: Drawing | None, figures: Path) -> Callable[[str, Any], object]:
    """``write_outputs``' ``on_frame``: the power envelope figure drawn from the table written."""
    from ..render.figures.envelope import CSV_NAME
    from ..render.figures.tasks import envelope_task

    def draw(name: str, frame: Any) -> None:
        if drawing is not None and name == CSV_NAME:
            drawing.draw(envelope_task(frame, figures))

    return draw


def saved_envelope_figure(result: Analysis, saved: Path, figures: Path, drawing: Drawing) -> None:
    """The power envelope figure of an analysis folder, from its ``power_envelope.csv``.

    Nothing without power samples; computed from the analysis when the folder has no table.
    """
    if result.power_samples is None or result.power_samples.is_empty():
        return  # before the imports: numpy is not needed then (start-up)
    import polars as pl

    from ..energy.envelope import ENVELOPE_SCHEMA, power_envelope
    from ..render.figures.envelope import CSV_NAME
    from ..render.figures.tasks import envelope_task

    envelope: pl.DataFrame | None = (
        pl.read_csv(saved / CSV_NAME, schema_overrides=ENVELOPE_SCHEMA)
        if (saved / CSV_NAME).is_file()
        else power_envelope(result)
    )
    if envelope is not None and not envelope.is_empty():
        drawing.draw(envelope_task(envelope, figures))


def length_sections(
    result: Analysis, length_dir: Path, cap: int | None, figures: Path, drawing: Drawing
) -> tuple[list[Section], list[str]]:
    """The report's length and straggler sections, and what to warn of.

    The figures go to ``drawing`` with the cap used (given, or inferred from the records); the
    warnings name length records of steps the run lacks and run steps without records.
    """
    from ..render.figures.tasks import length_figure_tasks
    from ..workload.lengths import read_packed_lengths
    from ..workload.stragglers import run_lengths

    responses = read_packed_lengths([length_dir])
    tables = run_lengths(result, responses, cap)
    for task in length_figure_tasks(responses, tables.tails, figures, tables.cap.value):
        drawing.draw(task)
    sections: list[Section] = [
        ("Response lengths per step", tables.stats),
        ("Rollout stragglers", tables.tails),
    ]  # energy per token: token_sections, from the same records
    return sections, list(tables.warnings)
