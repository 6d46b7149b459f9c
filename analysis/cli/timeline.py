"""``timeline``: a run as one Chrome trace-event file for ui.perfetto.dev and chrome://tracing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..jobs.timeline import DEFAULT_MAX_OPS, DEFAULT_MAX_RANGES, TimelineOutputs
from .analyze import AllRanges, PhaseMapFile, PoolOption, Steps, StripArgs, pools_from
from .app import ForceCombine, app, console, note, out_option, spinner


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB" if n_bytes >= 1e6 else f"{n_bytes / 1e3:.0f} kB"


@app.command()
def timeline(
    run: Annotated[
        list[Path],
        typer.Argument(help="The run's analysis folder, or its traces (files or folders)."),
    ],
    out: Annotated[
        Path, out_option("Trace file: .json, or .json.gz (gzipped; both viewers open it).")
    ] = Path("timeline.json.gz"),
    max_ops: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most GPU operations shown one by one; past it each stream's operations are "
            "merged into busy blocks (busy time kept; the file and this command say so).",
        ),
    ] = DEFAULT_MAX_OPS,
    max_ranges: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most NVTX ranges drawn; past it the shortest are left out (their time still "
            "counts in the args' phase-table totals; the file and this command say so).",
        ),
    ] = DEFAULT_MAX_RANGES,
    merge_gap_us: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Merge each stream's operations less than this many µs apart, however many "
            "there are (0: overlapping ones only).",
        ),
    ] = None,
    phase_map: PhaseMapFile = None,
    all_ranges: AllRanges = False,
    force_combine: ForceCombine = False,
    steps: Steps = None,
    strip_args: StripArgs = False,
    pool: PoolOption = None,
) -> None:
    """Timeline of a run: each NVTX range, GPU operations per stream, power and busy counters.

    Chrome trace-event JSON on the run's clock (µs), for ui.perfetto.dev or chrome://tracing.
    One slice per phase range (every NVTX range with --all-ranges) on the process (file, pid)
    and thread (tid) that marked it, nested as marked (start/end ranges that overlap without nesting: an extra track of their thread);
    its args hold the range's own start and end and its phase-table row's totals (wall, GPU
    busy, kernel, NCCL, memcpy, energy), which sum over all that row's ranges.

    Large runs stay loadable: past --max-ranges the shortest ranges are left out, past
    --max-ops each stream's GPU operations are merged into busy blocks. This command and the
    file's otherData say what was thinned; raise the limits to the counts printed to draw
    everything.
    """
    from ..jobs import timeline_to
    from ..options import AnalyzeOptions

    options = AnalyzeOptions(
        phase_map=phase_map,
        all_ranges=all_ranges,
        strip_args=strip_args,
        force_combine=force_combine,
        steps=steps,
        pools=pools_from(pool),
    )
    with spinner(details=False) as reporter:
        done = timeline_to(
            run,
            out,
            options,
            max_ops=max_ops,
            max_ranges=max_ranges,
            merge_gap_us=merge_gap_us,
            reporter=reporter,
        )
    _print_done(done)


def _print_done(done: TimelineOutputs) -> None:
    """The notes, then one line: what the timeline holds and where it is."""
    for line in done.notes:
        note(line)
    ranges = "no" if done.n_ranges is None else f"{done.n_ranges_drawn:,} of {done.n_ranges:,}"
    console.print(
        f"wrote {done.path} ({_size(done.size_bytes)}, {done.n_events:,} events: "
        f"{ranges} NVTX ranges, {done.n_gpu_ops:,} GPU operations, "
        f"{done.n_power_samples:,} power samples); open it in ui.perfetto.dev or chrome://tracing",
        highlight=False,
        soft_wrap=True,
    )
