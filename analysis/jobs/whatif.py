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

from nvtx_phases.naming import STEP  # stdlib only

from ..errors import WorkloadInputError, one_line
from .common import QUIET, Reporter
from .lengths_dir import find_lengths, traces_read
from .run import is_analysis_folder, open_run

if TYPE_CHECKING:  # Polars and the analysis are imported where used: importing jobs is cheap
    import polars as pl

    from ..model import Analysis, RunSummary
    from ..workload.whatif import WhatIfInputs

#: the file ``nvtx-phases logs`` writes: one row per step and VeRL stage
PHASE_TIMES = "phase_times.csv"


@dataclass(frozen=True)
class WhatIfOutputs:
    """What :func:`whatif_to` made: the per-step and run-level tables and the files written."""

    table: pl.DataFrame
    run: pl.DataFrame
    source: str
    written: list[Path]
    #: one line each: a step that dominates the run's totals (a warm-up), with the fix
    warnings: list[str] = field(default_factory=list)


# --- the inputs: a run's measurements ------------------------------------------------------------


def _driver_rows(analysis: Analysis, name: str) -> pl.DataFrame:
    """The window rows (step and the driver's top-level phases) of the process marking steps."""
    import polars as pl

    from ..model import WINDOW
    from ..phase_paths import is_step_phase

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
    return window.filter(
        (pl.col("trace") == trace)
        & (pl.col("pid") == pid)
        & ((pl.col("path") == STEP) | is_step_phase())
    )


def _without_cut(rows: pl.DataFrame, name: str) -> tuple[pl.DataFrame, tuple[str, ...]]:
    """The driver's ``rows`` without the steps cut at the capture's end, and a line per step.

    Such a step (:func:`~analysis.aggregate.shares.cut_steps`: its ``step`` range or one of its
    phases ends exactly at the capture's end) has no true time, so it is in no bound and not in
    the warm-up check. Every step cut: :class:`~analysis.errors.WorkloadInputError`.
    """
    import polars as pl

    from ..aggregate.shares import cut_steps, is_cut
    from ..aggregate.steps import CUT_WHY
    from ..render.whatif import format_seconds

    cut = cut_steps(rows)
    if not cut:
        return rows, ()
    chosen = pl.col("step").is_in(pl.Series(cut, dtype=rows.schema["step"]).implode())
    if rows.filter((pl.col("path") == STEP) & ~chosen).is_empty():
        raise WorkloadInputError(
            f"{name}: every step ({_spec(cut)}) has a range that ends exactly at the end of the "
            f"capture: {CUT_WHY}; no step has a true time, so no what-if bound is given"
        )
    lines = []
    for step in cut:
        in_step = rows.filter(pl.col("step") == step)
        ranges = in_step.filter(is_cut(in_step)).with_columns(_phase_name().alias("phase"))
        pairs = [(p, format_seconds(w / 1e9)) for p, w in ranges.select("phase", "wall_ns").rows()]
        what = (
            f"{pairs[0][0]} range ({pairs[0][1]}) ends"
            if len(pairs) == 1
            else "ranges " + ", ".join(f"{p} ({t})" for p, t in pairs) + " end"
        )
        lines.append(
            f"step {step} left out of every bound and of the warm-up check: its {what} exactly "
            f"at the end of the capture: {CUT_WHY}"
        )
    return rows.filter(~chosen), tuple(lines)


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

    from ..model import PROJECTION
    from ..workload.stragglers import GENERATION_PHASES, generation_tails
    from ..workload.whatif import WhatIfInputs, p90_response_tail

    rows, left_out = _without_cut(_driver_rows(analysis, name), name)
    kept = rows["step"].unique().implode()
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
        pl.col("pid").is_in(projected.implode()) & pl.col("step").is_in(kept)
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
        left_out=left_out,
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

    from nvtx_phases.naming import VERL_TRAINER_PHASES

    from ..workload.verl_logs import summed_steps
    from ..workload.whatif import PHASE_TIMES_SCHEMA, WhatIfInputs, p90_response_tail

    missing = [c for c in PHASE_TIMES_SCHEMA if c not in frame.columns]
    if missing:
        raise WorkloadInputError(f"{name}: no column(s) {', '.join(missing)}")
    summed = tuple(summed_steps(frame))
    frame = frame.select(*PHASE_TIMES_SCHEMA)
    if frame.null_count().sum_horizontal().item() or (frame["seconds"] < 0).any():
        raise WorkloadInputError(f"{name}: empty or negative values in step, phase or seconds")
    twice = frame.filter(frame.select("step", "phase").is_duplicated())
    if twice.height:
        step, phase = twice.row(0)[:2]
        raise WorkloadInputError(f"{name}: step {step} has phase {phase!r} twice")
    if frame.filter(pl.col("phase") == STEP).is_empty():
        raise WorkloadInputError(
            f"{name}: no rows of phase 'step' (the step's own time; `nvtx-phases logs` writes "
            "one for every step)"
        )
    times = frame.filter(pl.col("phase").is_in(VERL_TRAINER_PHASES))
    p90 = None if lengths_stats is None else p90_response_tail(times, lengths_stats)
    source = f"{name}: logged stage times"
    if summed:
        source += (
            f"; no step timer in steps {_spec(list(summed))} (VeRL 0.1 logs none): their step "
            "time is the sum of their stage timers, the time between stages not seen"
        )
    return WhatIfInputs(times, None, None, p90, None, None, source=source, summed_steps=summed)


def _spec(steps: list[int]) -> str:
    """``steps`` as a ``--steps`` value without spaces (``2:5,7``)."""
    from ..step_spec import steps_text

    return steps_text(steps).replace(", ", ",")


def select_times(inp: WhatIfInputs, steps: str) -> WhatIfInputs:
    """``inp`` (logged stage times) restricted to the steps the ``--steps`` spec ``steps`` picks.

    Raises :class:`~analysis.errors.InputError` for a bad spec or one that matches no step.
    """
    import polars as pl

    from ..errors import InputError
    from ..step_spec import parse_steps

    spec = parse_steps(steps)
    have = sorted(inp.times["step"].unique().to_list())
    chosen = spec.picks(have)
    if not chosen:
        raise InputError(
            f"--steps {spec.text!r} matches no step of this log (steps available: {_spec(have)})"
        )
    return dataclasses.replace(
        inp,
        times=inp.times.filter(pl.col("step").is_in(chosen)),
        p90_tail=None
        if inp.p90_tail is None
        else inp.p90_tail.filter(pl.col("step").is_in(chosen)),
        summed_steps=tuple(s for s in inp.summed_steps if s in chosen),
    )


def dominance_warnings(times: pl.DataFrame) -> list[str]:
    """A warning naming the steps that dominate the run's totals and the ``--steps`` without them."""
    import polars as pl

    from ..render.whatif import format_seconds
    from ..workload.whatif_pipeline import DOMINANT_FACTOR, dominant_steps

    steps = times.filter(pl.col("phase") == STEP).select("step", pl.col("seconds").alias("step_s"))
    found = dominant_steps(steps)
    if found.is_empty():
        return []
    which = ", ".join(
        f"step {r['step']} takes {format_seconds(r['step_s'])}, "
        f"{r['step_s'] / r['others_s']:.0f}× the median of the other steps "
        f"({format_seconds(r['others_s'])})"
        if r["others_s"]
        else f"step {r['step']} takes {format_seconds(r['step_s'])} (the others take 0 s)"
        for r in found.iter_rows(named=True)
    )
    kept = sorted(set(steps["step"].to_list()) - set(found["step"].to_list()))
    return [
        f"{which}: a warm-up or an outlier (≥ {DOMINANT_FACTOR:g}× the others' median) that "
        f"dominates every run total here; `--steps {_spec(kept)}` leaves it out"
    ]


def phase_times_file(inputs: Sequence[Path]) -> Path | None:
    """The ``phase_times.csv`` ``inputs`` name (a folder holding one, or the file), or None."""
    if len(inputs) != 1 or is_analysis_folder(inputs[0]):
        return None
    path = inputs[0]
    if path.is_dir() and (path / PHASE_TIMES).is_file():
        return path / PHASE_TIMES
    return path if path.suffix == ".csv" and path.is_file() else None


def read_phase_times(path: Path) -> pl.DataFrame:
    """A ``phase_times.csv`` with :data:`~analysis.workload.whatif.PHASE_TIMES_SCHEMA`'s types.

    Its ``source`` column (``nvtx-phases logs`` writes one) is kept where there is one.
    """
    import polars as pl

    from ..workload.whatif import PHASE_TIMES_SCHEMA

    try:
        raw = pl.read_csv(path, infer_schema_length=0)
        missing = [c for c in PHASE_TIMES_SCHEMA if c not in raw.columns]
        if missing:
            raise WorkloadInputError(f"{path}: no column(s) {', '.join(missing)}")
        source = ["source"] if "source" in raw.columns else []  # what `logs` writes beside
        return raw.select(
            *(pl.col(c).cast(t, strict=True) for c, t in PHASE_TIMES_SCHEMA.items()), *source
        )
    except pl.exceptions.PolarsError as exc:
        raise WorkloadInputError(
            f"{path}: not a phase_times.csv (step, phase, seconds): {one_line(str(exc))}"
        ) from exc


# --- the job -------------------------------------------------------------------------------------


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
    from ..render.files import check_output_folder
    from ..render.whatif import write_whatif
    from ..workload.whatif import run_level, whatif_table

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
