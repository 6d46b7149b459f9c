"""``whatif``: upper bounds on what four changes would save per step, from measured phase times."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .app import app, console, out_option, print_written, spinner

if TYPE_CHECKING:
    import polars as pl


def print_whatif_table(run: pl.DataFrame, source: str, warnings: list[str] | None = None) -> None:
    """The run-level bounds as a table, the phase times' source and any warning under it."""
    from rich.table import Table
    from rich.text import Text

    from ..render.report.whatif import RUN_HEADERS, run_rows

    table = Table(title="What-if bounds (savings are upper bounds; assumptions in whatif.md)")
    for i, header in enumerate(RUN_HEADERS):
        table.add_column(header, justify="left" if i < 2 else "right")
    for row in run_rows(run):
        table.add_row(*row)
    console.print(table)
    if 0 in run["steps"].to_list():
        console.print("–: not available for this run; whatif.md says why", highlight=False)
    console.print(f"phase times: {source}", highlight=False)
    for warning in warnings or []:
        console.print(Text(f"warning: {warning}", style="bold"))


@app.command()
def whatif(
    run: Annotated[
        list[Path],
        typer.Argument(
            help="The run's analysis folder, its traces, or a folder holding phase_times.csv "
            "(nvtx-phases logs)."
        ),
    ],
    out: Annotated[Path, out_option("Folder for whatif.csv, whatif.md, figures/.")] = Path(
        "whatif"
    ),
    lengths: Annotated[
        Path | None,
        typer.Option(
            help="Response-length records (PolyTrace layout); default: found beside the run. "
            "Adds the p90-response straggler bound."
        ),
    ] = None,
    steps: Annotated[
        str | None,
        typer.Option(
            "--steps",
            help="Only these steps: N, A:B (both included), A:, :B, or a comma list (1,3,7); "
            "2: skips a warm-up step 1 (the overlap pipeline then fills with step 2's gen).",
        ),
    ] = None,
    figures: Annotated[
        bool, typer.Option("--figures/--no-figures", help="Draw figures/whatif_per_step.")
    ] = True,
) -> None:
    """Upper bounds per step: gen/train overlapped, no straggler tail, balanced ranks, no gaps."""
    from ..jobs import whatif_to

    with spinner(details=False) as reporter:
        done = whatif_to(run, out, lengths=lengths, steps=steps, figures=figures, reporter=reporter)
    print_whatif_table(done.run, done.source, done.warnings)
    print_written(done.written, out)
