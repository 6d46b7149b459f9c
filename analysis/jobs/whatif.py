"""The ``whatif`` job: a run's measurements → upper bounds on four changes' savings → files.

A run is an analysis folder, traces (:func:`~analysis.jobs.run.open_run` tells which), or the
``phase_times.csv`` of VeRL's logged stage times (``nvtx-phases logs``; a folder holding it, or
the file): columns ``step`` (int), ``phase`` (VeRL stage name, ``step`` for the step's own
time), ``seconds``. From a trace the bounds use the driver's window phases, per-GPU busy time,
per-rank generation ends and power; from logs only the times (the rest is "not available").
Response-length records (``--lengths``, or found beside the run) add the p90-response variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.errors import WorkloadInputError, one_line
from analysis.jobs.common import QUIET, Reporter
from analysis.jobs.run import find_lengths, is_analysis_folder, open_run
from nvtx_phases.naming import STEP  # stdlib only

if TYPE_CHECKING:  # Polars and the analysis are imported where used: importing jobs is cheap
    import polars as pl

    from analysis.model import Analysis, RunSummary
    from analysis.workload.whatif import WhatIfInputs

#: the file ``nvtx-phases logs`` writes: one row per step and VeRL stage
PHASE_TIMES = "phase_times.csv"


@dataclass(frozen=True)
class WhatIfOutputs:
    """What :func:`whatif_to` made: the per-step and run-level tables and the files written."""

    table: pl.DataFrame
    run: pl.DataFrame
    source: str
    written: list[Path]


# --- the inputs: a run's measurements ------------------------------------------------------------


def _driver_rows(analysis: Analysis, name: str) -> pl.DataFrame:
    """The window rows (step and its direct children) of the process that marks the steps."""
    import polars as pl

    from analysis.model import WINDOW

    window = analysis.phases.filter(
        (pl.col("attribution") == WINDOW) & pl.col("step").is_not_null()
    )
    marks = window.filter(pl.col("path") == STEP)
    if marks.is_empty():
        raise WorkloadInputError(
            f"{name}: no step range on a thread that launches no GPU work (a driver, as VeRL's "
            "trainer is), and every what-if bound is per step of the driver's phases; mark steps "
            "and phases there (nvtx_phases.marking.step/phase)"
        )
    trace, pid = (
        marks.group_by("trace", "pid")
        .len()
        .sort(["len", "trace", "pid"], descending=[True, False, False])
        .select("trace", "pid")
        .row(0)
    )
    direct = pl.col("path").str.starts_with("step/") & (pl.col("path").str.count_matches("/") == 1)
    return window.filter(
        (pl.col("trace") == trace) & (pl.col("pid") == pid) & ((pl.col("path") == STEP) | direct)
    )


def _phase_name() -> pl.Expr:
    import polars as pl

    return pl.when(pl.col("path") == STEP).then(pl.lit(STEP)).otherwise(pl.col("path").str.slice(5))


def idle_power_total(summary: RunSummary) -> float | None:
    """The run's GPUs' idle power together (W); None when any GPU's baseline is unknown."""
    energy = summary.energy
    if energy is None or not energy.idle_power_w:
        return None
    values = list(energy.idle_power_w.values())
    return None if any(v is None for v in values) else float(sum(v for v in values if v))


def inputs_from_analysis(
    analysis: Analysis, lengths_stats: pl.DataFrame | None = None, *, name: str = "run"
) -> WhatIfInputs:
    """The bounds' inputs from an analysis: its driver's window phases, per GPU and per rank.

    Raises :class:`~analysis.errors.WorkloadInputError` for a run without step ranges.
    """
    import polars as pl

    from analysis.model import PROJECTION
    from analysis.workload.stragglers import GENERATION_PHASES, generation_tails
    from analysis.workload.whatif import WhatIfInputs, p90_response_tail

    rows = _driver_rows(analysis, name)
    times = rows.select(
        "step", _phase_name().alias("phase"), (pl.col("wall_ns") / 1e9).alias("seconds")
    )
    keys = rows.select("trace", "pid", "step", "path")
    busy = analysis.phase_devices.join(keys, on=["trace", "pid", "step", "path"], how="semi")
    busy = busy.select(
        "step",
        _phase_name().alias("phase"),
        "device",
        (pl.col("gpu_busy_ns") / 1e9).alias("busy_s"),
    )
    projected = analysis.phases.filter(
        (pl.col("attribution") == PROJECTION) & pl.col("canonical").is_in(GENERATION_PHASES)
    )["pid"]
    tails = generation_tails(analysis, lengths_stats).filter(
        pl.col("pid").is_in(projected.implode())
    )
    p90 = None
    if lengths_stats is not None:
        p90 = p90_response_tail(times, lengths_stats)
        if "tail_after_p90_ns" in tails.columns:  # the straggler table's own estimate
            p90 = tails.group_by("step").agg(
                (pl.col("tail_after_p90_ns").first() / 1e9).alias("tail_s")
            )
    gap = rows.filter(pl.col("path") == STEP).select("step", "gap_energy_j")
    trace, pid = rows.select("trace", "pid").row(0)
    return WhatIfInputs(
        times=times,
        busy=None if busy.is_empty() else busy,
        rank_ends=None if tails.is_empty() else tails.select("step", "pid", "gen_end_ns"),
        p90_tail=p90,
        gap_energy=None if gap["gap_energy_j"].is_null().all() else gap,
        idle_power_w=idle_power_total(analysis.summary),
        source=f"{name}: window phases of {trace} pid {pid}",
    )


def inputs_from_phase_times(
    frame: pl.DataFrame, lengths_stats: pl.DataFrame | None = None, *, name: str = "phase_times"
) -> WhatIfInputs:
    """The bounds' inputs from a ``phase_times.csv`` (:data:`PHASE_TIMES_SCHEMA`): times only.

    VeRL's trainer stages (gen, reward, old_log_prob, …) are the step's children; other names
    (timers nested in a stage) are left out. Raises :class:`~analysis.errors.WorkloadInputError`
    for missing or null values, a step or phase given twice, or no ``step`` rows.
    """
    import polars as pl

    from analysis.workload.whatif import PHASE_TIMES_SCHEMA, WhatIfInputs, p90_response_tail
    from nvtx_phases.naming import VERL_TRAINER_PHASES

    missing = [c for c in PHASE_TIMES_SCHEMA if c not in frame.columns]
    if missing:
        raise WorkloadInputError(f"{name}: no column(s) {', '.join(missing)}")
    frame = frame.select(*PHASE_TIMES_SCHEMA)
    if frame.null_count().sum_horizontal().item() or (frame["seconds"] < 0).any():
        raise WorkloadInputError(f"{name}: empty or negative values in step, phase or seconds")
    twice = frame.filter(frame.select("step", "phase").is_duplicated())
    if twice.height:
        step, phase = twice.row(0)[:2]
        raise WorkloadInputError(f"{name}: step {step} has phase {phase!r} twice")
    if frame.filter(pl.col("phase") == STEP).is_empty():
        raise WorkloadInputError(f"{name}: no rows of phase 'step' (the step's own time)")
    times = frame.filter(pl.col("phase").is_in(VERL_TRAINER_PHASES))
    p90 = None if lengths_stats is None else p90_response_tail(times, lengths_stats)
    return WhatIfInputs(times, None, None, p90, None, None, source=f"{name}: logged stage times")


def phase_times_file(inputs: Sequence[Path]) -> Path | None:
    """The ``phase_times.csv`` ``inputs`` name (a folder holding one, or the file), or None."""
    if len(inputs) != 1 or is_analysis_folder(inputs[0]):
        return None
    path = inputs[0]
    if path.is_dir() and (path / PHASE_TIMES).is_file():
        return path / PHASE_TIMES
    return path if path.suffix == ".csv" and path.is_file() else None


def read_phase_times(path: Path) -> pl.DataFrame:
    """A ``phase_times.csv`` with :data:`~analysis.workload.whatif.PHASE_TIMES_SCHEMA`'s types."""
    import polars as pl

    from analysis.workload.whatif import PHASE_TIMES_SCHEMA

    try:
        raw = pl.read_csv(path, infer_schema_length=0)
        missing = [c for c in PHASE_TIMES_SCHEMA if c not in raw.columns]
        if missing:
            raise WorkloadInputError(f"{path}: no column(s) {', '.join(missing)}")
        return raw.select(pl.col(c).cast(t, strict=True) for c, t in PHASE_TIMES_SCHEMA.items())
    except pl.exceptions.PolarsError as exc:
        raise WorkloadInputError(
            f"{path}: not a phase_times.csv (step, phase, seconds): {one_line(str(exc))}"
        ) from exc


# --- the job -------------------------------------------------------------------------------------


def whatif_to(
    inputs: Sequence[Path],
    out: Path,
    *,
    lengths: Path | None = None,
    figures: bool = True,
    reporter: Reporter = QUIET,
) -> WhatIfOutputs:
    """Bounds per step into ``out`` (``whatif.csv``, ``whatif.md``, a figure): ``whatif``.

    ``inputs``: an analysis folder, traces, or a ``phase_times.csv`` (or its folder).
    ``lengths``: response-length records (default: :func:`~analysis.jobs.run.find_lengths`).
    Raises :class:`~analysis.errors.WorkloadInputError` for a run without steps.
    """
    from analysis.render.files import check_output_folder
    from analysis.render.whatif import write_whatif
    from analysis.workload.lengths import length_stats, read_packed_lengths
    from analysis.workload.whatif import run_level, whatif_table

    check_output_folder(out)
    length_dir = lengths or find_lengths(inputs)
    stats = None
    if length_dir is not None:
        reporter.note(f"response lengths from {length_dir}")
        stats = length_stats(read_packed_lengths([length_dir]))
    logs = phase_times_file(inputs)
    if logs is not None:
        inp = inputs_from_phase_times(read_phase_times(logs), stats, name=str(logs))
    else:
        name = ", ".join(map(str, inputs))
        with open_run(inputs, label=name, reporter=reporter) as analysis:
            if not analysis.summary.gpu.total_gpu_ns:
                reporter.note(
                    "no GPU activity in this run (CPU-only capture): the bounds are wall-time "
                    "bounds of its phases; 'GPU' in their assumptions means whatever ran them"
                )
            inp = inputs_from_analysis(analysis, stats, name=name)
    table = whatif_table(inp)
    run = run_level(table)
    reporter.stage("writing outputs")
    written = write_whatif(table, run, out, source=inp.source, figures=figures)
    return WhatIfOutputs(table=table, run=run, source=inp.source, written=written)
