"""``compare``: runs side by side, phase by phase."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .analyze import Steps, StripArgs
from .app import app, console, fail, out_option, print_written, spinner

#: most lines of compare.md printed (the file has them all)
COMPARE_PRINTED_LINES = 200


@app.command()
def compare(
    runs: Annotated[
        list[Path],
        typer.Argument(help="Runs: analysis folders, trace files, or folders of one run's traces."),
    ],
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="One label per run (default: names).")
    ] = None,
    out: Annotated[Path, out_option("Folder for the comparison.")] = Path("compare"),
    phase_map: Annotated[
        Path | None,
        typer.Option(
            "--phase-map", help="TOML file that extends or renames the phase names (traces only)."
        ),
    ] = None,
    all_ranges: Annotated[
        bool,
        typer.Option("--all-ranges", help="Treat every NVTX range as a phase (traces only)."),
    ] = False,
    steps: Steps = None,
    strip_args: StripArgs = False,
) -> None:
    """Compare runs per phase: time, energy, power, data movement (median, p10–p90, differences).

    Runs without step ranges are compared over the whole capture. Runs with no phase in common
    are refused.
    """
    from ..jobs import compare_to
    from ..options import AnalyzeOptions

    options = AnalyzeOptions(
        phase_map=phase_map, all_ranges=all_ranges, strip_args=strip_args, steps=steps
    )
    if len(runs) < 2:
        raise fail("compare needs at least two runs")
    labels = list(label or [])
    if labels and len(labels) != len(runs):
        raise fail(f"{len(labels)} label(s) for {len(runs)} runs")
    labels = labels or [r.stem if r.is_file() else r.name for r in runs]
    if len(set(labels)) != len(labels):
        raise fail(f"run labels must differ: {', '.join(labels)} (use --label)")
    with spinner(details=False) as reporter:
        written = compare_to(
            dict(zip(labels, runs, strict=True)),
            out,
            options,
            reporter=reporter,
        )
    lines = (out / "compare.md").read_text(encoding="utf-8").splitlines()
    shown = lines[:COMPARE_PRINTED_LINES]  # thousands of phases (--all-ranges) stay in the file
    if len(lines) > len(shown):
        shown.append(f"… {len(lines) - len(shown):,} more lines in {out / 'compare.md'}")
    console.print("\n".join(shown), highlight=False, soft_wrap=True)
    print_written(written, out)
