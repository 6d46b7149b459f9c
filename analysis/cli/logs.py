"""``logs``: phase tables from VeRL's own console or JSON-lines logs, no trace needed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .app import app, console, out_option, print_written, spinner


@app.command()
def logs(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="VeRL console logs or file-logger JSON lines, one per run segment, in order "
            "(a step logged again keeps the later file's values)."
        ),
    ],
    out: Annotated[Path, out_option("Folder for the tables and the figure.")] = Path("verl_logs"),
) -> None:
    """Phase times and shares per step from VeRL's timing_s/* (0.1: timing/*) metrics."""
    from ..jobs.logs import logs_to
    from ..render.report.verl_logs import summary_rich_table

    with spinner(details=False) as reporter:
        done = logs_to(paths, out, reporter=reporter)
    console.print(summary_rich_table(done.summary, done.title))
    print_written(done.written, out)
