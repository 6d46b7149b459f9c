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
    """The report's length, straggler, multi-turn and DAPO sections, and what to warn of.

    The figures go to ``drawing`` with the cap used (given, or inferred from the records); the
    warnings name length records of steps the run lacks and run steps without records; the
    multi-turn and DAPO notes (what their records cannot say) come with them.
    """
    from ..render.figures.tasks import length_figure_tasks
    from ..workload.lengths import read_packed_lengths
    from ..workload.records import record_files
    from ..workload.stragglers import run_lengths
    from .rollouts import compute_rollout_tables

    files = record_files([length_dir])
    sections: list[Section] = []
    warnings: list[str] = []
    if files.packed:
        responses = read_packed_lengths(files.packed)
        tables = run_lengths(result, responses, cap)
        for task in length_figure_tasks(responses, tables.tails, figures, tables.cap.value):
            drawing.draw(task)
        sections += [
            ("Response lengths per step", tables.stats),
            ("Rollout stragglers", tables.tails),
        ]  # energy per token: token_sections, from the same records
        warnings += tables.warnings
    rollouts = compute_rollout_tables(files)
    sections += [
        (ROLLOUT_TITLES[name], table.drop(REPORT_LEAVES_OUT.get(name, ())))
        for name, table in rollouts.tables.items()
    ]
    return sections, warnings + rollouts.warnings + rollouts.notes


#: the report's section title of each multi-turn and DAPO table
ROLLOUT_TITLES = {
    "multiturn_steps": "Multi-turn rollouts per step (latencies summed over samples, not wall time)",
    "multiturn_turn_counts": "Multi-turn samples by turn count (stragglers: each step's slowest 10% of samples)",
    "multiturn_turns": "Multi-turn prefix cache by turn",
    "dapo_steps": "DAPO filtering per trainer step (prompts generated, kept, used)",
}
#: columns the report leaves out (totals behind its ratios, the complement of a share): the
#: tables stay readable; ``lengths analyze``'s CSV files have them all
REPORT_LEAVES_OUT = {
    "multiturn_steps": (
        "turns_total",
        "engine_share_of_latency_fraction",
        "prompt_tokens",
        "cached_tokens",
        "response_tokens",
        "loss_tokens",
        "slowest_sample_turns",
        "slowest_decile_turns_over_p50",
    ),
}
