"""``kernels_by_phase.csv`` and the report's "top kernels per phase" section.

The table is :func:`analysis.aggregate.kernels_by_phase.kernels_by_phase`'s. The section shows,
over all steps, the top kernels of the phases with the most kernel time; kernel names are free
text (escaped by the report, like every name) and long C++ names are shortened there (the CSV
keeps them whole).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ...aggregate.kernels_by_phase import SCHEMA, kernels_by_phase
from ...model import Analysis
from ..outputs.tables import has_kernel_columns
from .units import Section

FILE_NAME = "kernels_by_phase.csv"
#: phases and kernels per phase the report shows
REPORT_PHASES = 5
REPORT_KERNELS = 5
#: kernel names longer than this are cut in the report (with "…")
REPORT_NAME_CHARS = 90
SECTION_TITLE = "Top kernels per phase ({steps}; the phases with the most kernel time)"


def kernel_sections(analysis: Analysis, folder: str | Path | None) -> list[Section]:
    """The report's section (none when no phase ran a kernel).

    A whole run's folder: its ``kernels_by_phase.csv`` (already computed; no scan of a
    possibly huge activity file). Otherwise (traces, a step selection, a folder from before
    that table) computed from the analysis's GPU activity, when it has one.
    """
    whole_run = analysis.summary.selection is None
    table = read_kernels_by_phase(folder) if folder is not None and whole_run else None
    if table is None and has_kernel_columns(analysis):
        table = kernels_by_phase(analysis.gpu_activity, analysis.phases, top=REPORT_KERNELS)
    steps = "all steps" if whole_run else "the selected steps"
    section = top_kernels_section(table, steps=steps) if table is not None else None
    return [section] if section is not None else []


def read_kernels_by_phase(folder: str | Path) -> pl.DataFrame | None:
    """The table an analysis folder holds, or None (a folder from before this table)."""
    path = Path(folder) / FILE_NAME
    if not path.is_file():
        return None
    return pl.read_csv(path, schema_overrides=SCHEMA)


def _short(name: str) -> str:
    return name if len(name) <= REPORT_NAME_CHARS else name[: REPORT_NAME_CHARS - 1] + "…"


def top_kernels_section(
    table: pl.DataFrame,
    *,
    phases: int = REPORT_PHASES,
    kernels: int = REPORT_KERNELS,
    steps: str = "all steps",
) -> Section | None:
    """The report section: the top ``kernels`` of the ``phases`` largest phases over ``steps``.

    Phases are (attribution, path) pairs ranked by their kernel time; None when no phase ran a
    kernel.
    """
    everything = table.filter(pl.col("scope") == "all")
    largest = (
        everything.group_by("attribution", "path")
        .agg(pl.col("phase_kernel_ns").first())
        .sort(["phase_kernel_ns", "attribution", "path"], descending=[True, False, False])
        .head(phases)
        .with_row_index("order")
    )
    if not largest.height:
        return None
    rows = (
        everything.join(largest.drop("phase_kernel_ns"), on=["attribution", "path"])
        .filter(pl.col("rank") <= kernels)
        .sort("order", "rank")
    )
    frame = rows.select(
        pl.col("path").alias("phase path"),
        "attribution",
        (pl.col("phase_kernel_ns") / 1e6).alias("phase kernel ms"),
        pl.col("rank").alias("#"),
        pl.col("name").map_elements(_short, return_dtype=pl.String).alias("kernel"),
        pl.col("op_class").alias("class"),
        "count",
        (pl.col("total_ns") / 1e6).alias("total ms"),
        (pl.col("mean_ns") / 1e3).alias("mean µs"),
        pl.col("share_pct").alias("share %"),
    )
    return SECTION_TITLE.format(steps=steps), frame
