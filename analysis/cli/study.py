"""``study``: labelled runs with axes in one tidy table (run × phase × metric)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, console, out_option, print_written, spinner


@app.command()
def study(
    file: Annotated[
        Path,
        typer.Argument(
            help="Study TOML: [[run]] entries with a label, axes and path(s) (traces or an "
            "analysis folder), verl_log (VeRL logs) and/or lengths (records); optional power, "
            "phase_map, all_ranges."
        ),
    ],
    out: Annotated[Path, out_option("Folder for the study.")] = Path("study"),
) -> None:
    """Compare a study's runs per phase along its axes (policy, reward, task, hardware, n_gpus, …).

    Writes study.csv (one row per run × phase × metric, the axes as columns; metric definitions
    in study_metrics.csv), figures/ (one per question: phase signature, reward cost, energy per
    token, response lengths, scaling), report.html and report.md. A phase is compared between the
    runs that have it; runs sharing none are left out, named with the reason. Runs of VeRL logs
    or records alone carry what those give (timers, logged memory; lengths, multi-turn, DAPO).
    """
    from rich.table import Table

    from ..jobs.study import study_to

    with spinner(details=False) as reporter:
        result = study_to(file, out, reporter=reporter)
    import polars as pl

    tidy = pl.read_csv(out / "study.csv", infer_schema_length=0)
    table = Table(title=f"{tidy['run'].n_unique()} run(s), {result.n_rows:,} rows")
    for col in ("run", "phases", "metrics"):
        table.add_column(col)
    for (run,), group in tidy.group_by(["run"], maintain_order=True):
        table.add_row(str(run), str(group["path"].n_unique()), str(group["metric"].n_unique()))
    console.print(table)
    for question, why in result.not_drawn.items():
        console.print(f"not drawn — {question}: {why}", highlight=False, markup=False)
    for label, why in result.left_out.items():
        console.print(f"left out {label}: {why}", highlight=False, markup=False)
    print_written(result.written, out)
