"""The ``whatif`` job: a run's measurements → upper bounds on four changes' savings → files.

A run is an analysis folder, traces (:func:`~analysis.jobs.run.open_run` tells which), or the
``phase_times.csv`` of VeRL's logged stage times (``nvtx-phases logs``; a folder holding it, or
the file): columns ``step`` (int), ``phase`` (VeRL stage name, ``step`` for the step's own
time), ``seconds``, and optionally ``source`` (the logged key; ``sum of stage timers`` for a step
time that no step timer gave, VeRL 0.1's case). From a trace the bounds use the driver's window
phases, per-GPU busy time, per-rank generation ends and power; from logs only the times (the
rest is "not available"). ``--steps`` restricts either to some steps. A traced step with a
range cut at the capture's end (nsys closed it there) has no true time: it is left out of every
bound, with a warning naming it. Response-length records (``--lengths``, or found beside the
run or beside the traces an analysis folder was made from) add the p90-response variant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .common import QUIET, Reporter
from .lengths_dir import find_lengths, traces_read
from .run import is_analysis_folder, open_run

#: the file ``nvtx-phases logs`` writes: one row per step and VeRL stage
PHASE_TIMES = "phase_times.csv"

if TYPE_CHECKING:  # Polars and the analysis are imported where used: importing jobs is cheap
    import polars as pl


@dataclass(frozen=True)
class WhatIfOutputs:
    """What :func:`whatif_to` made: the per-step and run-level tables and the files written."""

    table: pl.DataFrame
    run: pl.DataFrame
    source: str
    written: list[Path]
    #: one line each: a step that dominates the run's totals (a warm-up), with the fix
    warnings: list[str] = field(default_factory=list)


def phase_times_file(inputs: Sequence[Path]) -> Path | None:
    """The ``phase_times.csv`` ``inputs`` name (a folder holding one, or the file), or None."""
    if len(inputs) != 1 or is_analysis_folder(inputs[0]):
        return None
    path = inputs[0]
    if path.is_dir() and (path / PHASE_TIMES).is_file():
        return path / PHASE_TIMES
    return path if path.suffix == ".csv" and path.is_file() else None


def _length_stats(length_dir: Path | None, reporter: Reporter) -> pl.DataFrame | None:
    """Per-step length statistics of the records in ``length_dir`` (None: none found)."""
    from ..workload.lengths import length_stats, read_packed_lengths

    if length_dir is None:
        return None
    reporter.note(f"response lengths from {length_dir}")
    return length_stats(read_packed_lengths([length_dir]))


def whatif_to(
    inputs: Sequence[Path],
    out: Path,
    *,
    lengths: Path | None = None,
    steps: str | None = None,
    figures: bool = True,
    reporter: Reporter = QUIET,
) -> WhatIfOutputs:
    """Bounds per step into ``out`` (``whatif.csv``, ``whatif.md``, a figure): ``whatif``.

    ``inputs``: an analysis folder, traces, or a ``phase_times.csv`` (or its folder).
    ``lengths``: response-length records (default: :func:`~analysis.jobs.lengths_dir.find_lengths`
    beside the inputs, else beside the traces an analysis folder was made from).
    ``steps``: a ``--steps`` spec (:mod:`analysis.run.select`): only those steps. A step that
    dominates the run's totals, and a step left out as cut at the capture's end, are warned
    about (``warnings``, and in ``whatif.md``).
    Raises :class:`~analysis.errors.WorkloadInputError` for a run without steps, or whose
    every step is cut at the capture's end.
    """
    from ..render.outputs.files import check_output_folder
    from ..render.report.whatif import write_whatif
    from ..workload.whatif import run_level, whatif_table
    from ..workload.whatif_inputs import (
        dominance_warnings,
        inputs_from_analysis,
        inputs_from_phase_times,
        read_phase_times,
        select_times,
    )

    check_output_folder(out)
    length_dir = lengths or find_lengths(inputs)
    logs = phase_times_file(inputs)
    if logs is not None:
        stats = _length_stats(length_dir, reporter)
        inp = inputs_from_phase_times(read_phase_times(logs), stats, name=str(logs))
        inp = inp if steps is None else select_times(inp, steps)
    else:
        name = ", ".join(map(str, inputs))
        with open_run(inputs, label=name, steps=steps, reporter=reporter) as analysis:
            if not analysis.summary.gpu.total_gpu_ns:
                reporter.note(
                    "no GPU activity in this run (CPU-only capture): the bounds are wall-time "
                    "bounds of its phases; 'GPU' in their assumptions means whatever ran them"
                )
            length_dir = length_dir or find_lengths(traces_read(analysis))
            stats = _length_stats(length_dir, reporter)
            inp = inputs_from_analysis(analysis, stats, name=name)
    if steps is not None:
        inp = dataclasses.replace(inp, source=f"{inp.source}; --steps {steps.strip()}")
    table = whatif_table(inp)
    run = run_level(table)
    warnings = [*inp.left_out, *dominance_warnings(inp.times)]
    reporter.stage("writing outputs")
    written = write_whatif(table, run, out, source=inp.source, figures=figures, warnings=warnings)
    return WhatIfOutputs(
        table=table, run=run, source=inp.source, written=written, warnings=warnings
    )
