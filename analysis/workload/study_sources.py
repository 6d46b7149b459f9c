"""Where a study's numbers come from: one loader per source table of the metric registry.

Each :class:`~.study_metrics.StudyMetric` names its source and column; :data:`SOURCES` reads a
source from one loaded run (:class:`LoadedRun`: its analysis, its VeRL log values, its records),
as a frame of ``path, attribution, n_steps`` + metric columns, or None where the run has no such
input. Every
number is an existing table's own definition (compare's per-step metrics, the report's shares,
``tokens_energy.csv``, ``memory_per_phase.csv``, VeRL's timers and memory, the multi-turn, DAPO
and length tables), summarized over steps as :data:`STUDY_METRICS` says.

*Phase* metrics are compared only between runs having the phase (:func:`analysis.workload.study.
tidy_table`); *run* metrics (``scope="run"``: records, logged memory) describe a run's whole
workload and sit on its ``step`` row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from nvtx_phases.naming import PATH_SEP, STEP

from ..aggregate.shares import share_over_steps, step_shares
from ..aggregate.steps import over_steps
from ..model import WINDOW, Analysis
from .compare import run_metrics
from .study_metrics import STUDY_METRICS

_MB = 1_000_000
#: the tidy table's attribution (and ``input``) of numbers of records: no GPU attribution
RECORDS = "records"
#: the ``input`` of numbers read from VeRL's logs (``trace``: from the run's traces)
VERL_LOG = "verl_log"
TRACE = "trace"


@dataclass(frozen=True)
class LoadedRun:
    """One study run's inputs, loaded: what the sources read."""

    label: str
    analysis: Analysis | None = None  #: traces or an analysis folder (with its step tokens)
    log_values: pl.DataFrame | None = None  #: :func:`~.verl_logs.latest_values` of its logs
    records: tuple[Path, ...] = field(default=())  #: length, multi-turn and DAPO record folders
    responses: pl.DataFrame | None = None  #: its response lengths (:mod:`.lengths`)


#: a source: one loaded run → ``path, attribution, n_steps`` + its columns, or None
Source = Callable[[LoadedRun], pl.DataFrame | None]


def _phase_steps(run: LoadedRun) -> pl.DataFrame | None:
    """Median per phase over steps: compare's per-step metrics, or VeRL's timers (wall only).

    A run without GPUs (a CPU capture) has only its wall times: its GPU figures are null
    (:func:`~analysis.workload.compare.run_metrics`, as in ``compare``).
    """
    if run.analysis is None:
        return _logged_phase_steps(run.log_values) if run.log_values is not None else None
    per_step, whole = run_metrics(run.label, run.analysis)
    wide = over_steps(per_step)
    if whole:
        wide = wide.with_columns(pl.lit(None, dtype=pl.Int64).alias("n_steps"))
    return wide


def _log_path(phase: pl.Expr) -> pl.Expr:
    """VeRL's timer name → the phase path a trace gives it (``step``, ``step/gen``, …)."""
    return pl.when(phase == STEP).then(pl.lit(STEP)).otherwise(pl.lit(STEP + PATH_SEP) + phase)


def _logged_phase_steps(values: pl.DataFrame) -> pl.DataFrame:
    """Per VeRL timer: the median over steps of its seconds, as ``wall_ms`` (the driver's time)."""
    from .verl_logs import phase_times

    return (
        phase_times(values)
        .group_by("phase", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("n_steps"),
            (pl.col("seconds").median() * 1000).alias("wall_ms"),
        )
        .select(
            _log_path(pl.col("phase")).alias("path"),
            pl.lit(WINDOW).alias("attribution"),
            "*",
            pl.lit(VERL_LOG).alias("input"),
        )
        .drop("phase")
    )


def _step_shares(run: LoadedRun) -> pl.DataFrame | None:
    """The median over steps of each direct phase's share of its step (time and energy, %).

    :func:`analysis.aggregate.shares.step_shares` then ``share_over_steps`` (the one definition
    of a share; VeRL's timers through :func:`~.verl_logs.step_shares`, the same definition).
    """
    if run.analysis is None:
        if run.log_values is None:
            return None
        from .verl_logs import phase_summary, phase_times

        summary = phase_summary(phase_times(run.log_values)).filter(pl.col("phase") != STEP)
        return summary.select(
            _log_path(pl.col("phase")).alias("path"),
            pl.lit(WINDOW).alias("attribution"),
            "n_steps",
            pl.col("share_median_pct").alias("time"),
            pl.lit(VERL_LOG).alias("input"),
        )
    phases = run.analysis.phases
    over = share_over_steps(step_shares(phases))
    steps = phases.filter(pl.col("path") == STEP)["attribution"].unique().sort()
    return over.select(
        (pl.lit(STEP + PATH_SEP) + pl.col("canonical")).alias("path"),
        pl.lit(steps[0] if steps.len() else WINDOW).alias("attribution"),
        "n_steps",
        pl.col("time_share_median").alias("time"),
        pl.col("energy_share_median").alias("energy"),
    )


def _token_rows(run: LoadedRun) -> pl.DataFrame | None:
    """``tokens_energy.csv`` of the run (None without step tokens), its path per row."""
    if run.analysis is None or run.analysis.step_tokens is None:
        return None
    from .token_energy import tokens_energy

    table = tokens_energy(run.analysis)
    if table is None:
        return None
    return table.filter(pl.col("scope") != "kind").with_columns(
        pl.when(pl.col("scope") == "step")
        .then(pl.lit(STEP))
        .otherwise(pl.lit(STEP + PATH_SEP) + pl.col("phase"))
        .alias("path"),
        pl.lit(WINDOW).alias("attribution"),
    )


def _tokens_energy(run: LoadedRun) -> pl.DataFrame | None:
    """The over-all-steps rows of ``tokens_energy.csv`` (``step`` null): J/token, tokens/J."""
    rows = _token_rows(run)
    if rows is None:
        return None
    return rows.filter(pl.col("step").is_null()).select(
        "path", "attribution", "n_steps", "j_per_token", "tokens_per_j"
    )


def _power_ratio(run: LoadedRun) -> pl.DataFrame | None:
    """Inference-type over training-type mean power over all steps: the step row only."""
    rows = _token_rows(run)
    if rows is None:
        return None
    return rows.filter(pl.col("step").is_null() & (pl.col("scope") == "step")).select(
        "path", "attribution", "n_steps", "inference_over_training"
    )


def _per_step_samples(run: LoadedRun) -> pl.DataFrame | None:
    """Per step and phase row of ``tokens_energy.csv``: its energy and the step's sequences."""
    rows = _token_rows(run)
    if rows is None or run.analysis is None or run.analysis.step_tokens is None:
        return None
    sequences = run.analysis.step_tokens.select("step", pl.col("n_sequences").alias("n_seq"))
    return rows.filter(pl.col("step").is_not_null()).join(sequences, on="step", how="inner")


def _energy_per_sample(run: LoadedRun) -> pl.DataFrame | None:
    """Per phase: the median over steps of its energy / the step's sequences (where known)."""
    per_step = _per_step_samples(run)
    if per_step is None:
        return None
    # a phase without power keeps its row, null (no energy: not measured, not 0)
    known = pl.col("energy_j").is_not_null() & (pl.col("n_seq") > 0)
    per_sample = pl.when(known).then(pl.col("energy_j") / pl.col("n_seq"))
    return per_step.group_by("path", "attribution", maintain_order=True).agg(
        known.sum().cast(pl.Int64).alias("n_steps"),
        per_sample.median().alias("energy_per_sample_j"),
    )


def _samples(run: LoadedRun) -> pl.DataFrame | None:
    """The median over steps of the step's sequences (each phase row of the step has it)."""
    per_step = _per_step_samples(run)
    if per_step is None:
        return None
    return per_step.group_by("path", "attribution", maintain_order=True).agg(
        pl.len().cast(pl.Int64).alias("n_steps"), pl.col("n_seq").cast(pl.Float64).median()
    )


def _memory(run: LoadedRun) -> pl.DataFrame | None:
    """Per phase: the peak on any GPU over its steps; copies per step over its GPUs, median."""
    if run.analysis is None or run.analysis.memory is None or run.analysis.memory.is_empty():
        return None
    table = run.analysis.memory
    per_step = table.group_by("path", "attribution", "step", "start_ns", maintain_order=True).agg(
        pl.col("peak_bytes").max(), pl.col("h2d_bytes").sum(), pl.col("d2h_bytes").sum()
    )
    return per_step.group_by("path", "attribution", maintain_order=True).agg(
        pl.col("step").n_unique().cast(pl.Int64).alias("n_steps"),
        (pl.col("peak_bytes").max() / _MB).alias("peak_mb"),
        (pl.col("h2d_bytes").median() / _MB).alias("h2d_mb"),
        (pl.col("d2h_bytes").median() / _MB).alias("d2h_mb"),
    )


def _run_row(frame: pl.DataFrame, source: str, n_steps: int, **values: pl.Expr) -> pl.DataFrame:
    """One ``step`` row of run-scope metrics read from ``source`` (:data:`VERL_LOG`, records)."""
    return frame.select(
        pl.lit(STEP).alias("path"),
        pl.lit(WINDOW if source == VERL_LOG else RECORDS).alias("attribution"),
        pl.lit(n_steps, pl.Int64).alias("n_steps"),
        *(expr.alias(name) for name, expr in values.items()),
        pl.lit(source).alias("input"),
    )


def _logged_memory(run: LoadedRun) -> pl.DataFrame | None:
    """The highest device memory VeRL logged over the steps (trainer or actor prefix)."""
    if run.log_values is None:
        return None
    from .verl_memory import memory_per_step

    table, _notes = memory_per_step(run.log_values)
    if table.is_empty():
        return None
    names = ("max_memory_allocated_gb", "max_memory_reserved_gb")
    return _run_row(
        table, VERL_LOG, table["step"].n_unique(), **{n: pl.col(n).max() for n in names}
    )


def _lengths(run: LoadedRun) -> pl.DataFrame | None:
    """:func:`~.study_views.length_summary` of the run's response lengths (medians over steps)."""
    if run.responses is None:
        return None
    from .study_views import length_summary

    row = length_summary({run.label: run.responses})
    names = ("max_over_mean", "rank_imbalance", "mean_len")
    return _run_row(row, RECORDS, int(row["n_steps"][0]), **{n: pl.col(n) for n in names})


def _over_record_steps(table: pl.DataFrame | None, columns: dict[str, str]) -> pl.DataFrame | None:
    """Medians over a record table's steps of ``columns`` (source name → tidy column name)."""
    if table is None or table.is_empty():
        return None
    return _run_row(
        table,
        RECORDS,
        table.height,
        **{mine: pl.col(theirs).cast(pl.Float64).median() for theirs, mine in columns.items()},
    )


def _multiturn(run: LoadedRun) -> pl.DataFrame | None:
    """Medians over steps of ``multiturn_steps.csv``'s columns."""
    if not run.records:
        return None
    from .records import multiturn_step_table

    columns = {m.column: m.column for m in STUDY_METRICS if m.source == "multiturn"}
    return _over_record_steps(multiturn_step_table(run.records), columns)


def _dapo(run: LoadedRun) -> pl.DataFrame | None:
    """Medians over trainer steps of ``dapo_steps.csv``'s ratios and generation batches."""
    if not run.records:
        return None
    from .records import dapo_step_table

    columns = {
        "kept_of_generated_fraction": "kept_of_generated",
        "used_of_generated_fraction": "used_of_generated",
        "generation_batches": "generation_batches",
    }
    table = dapo_step_table(run.records)
    # a trainer step whose batch the records do not fill (a log cut mid-step) is not a step's
    # filtering: left out of the medians
    filled = table.filter(pl.col("batch_filled")) if table is not None else None
    return _over_record_steps(filled, columns)


SOURCES: dict[str, Source] = {
    "phase_steps": _phase_steps,
    "step_shares": _step_shares,
    "tokens_energy": _tokens_energy,
    "power_ratio": _power_ratio,
    "energy_per_sample": _energy_per_sample,
    "samples": _samples,
    "memory": _memory,
    "logged_memory": _logged_memory,
    "lengths": _lengths,
    "multiturn": _multiturn,
    "dapo": _dapo,
}
