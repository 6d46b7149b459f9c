"""Compare runs phase by phase: median and p10–p90 over steps, differences against the first run.

Runs of different step counts compare on their medians; steps present in every run are also
compared index by index (``compare_steps.csv``). Runs without step ranges (captures of code
that marks phases but no ``step``, or ``--all-ranges`` on a plain PyTorch capture) compare
each phase over the whole capture instead: one value per run, ``n_steps`` null. Runs that
cannot be compared (no phases, per-step against whole-capture, no phase in common with the
first run) raise :class:`~analysis.errors.WorkloadInputError` with the reason.

This module computes only; the tables, Markdown and figures are written by
:mod:`analysis.render.report.comparison` and :mod:`analysis.render.figures.compare`.
"""

from __future__ import annotations

import polars as pl

from ..aggregate.steps import STEP_METRICS, has_gpus, over_steps, step_phase_metrics
from ..errors import WorkloadInputError
from ..model import Analysis

#: the columns naming one phase in the comparison tables
KEYS = ["path", "attribution"]

#: per metric unit, the smallest first-run value a relative difference (% and ratio) is
#: computed from: 1 µs, 1 KB, 1 mJ, 1 W. Below it a percentage says nothing (a 2.3e-15 J
#: baseline gave +6e16 %); only the difference in the metric's unit is given. Percentages
#: (GPU busy) differ in percentage points only: no relative difference.
PCT_FLOORS: dict[str, float] = {"ms": 1e-3, "MB": 1e-3, "J": 1e-3, "W": 1.0}
#: each floor as the comparison states it
FLOOR_TEXT: dict[str, str] = {"ms": "1 µs", "MB": "1 KB", "J": "1 mJ", "W": "1 W"}


def pct_floor(metric: str) -> float | None:
    """The smallest first-run value of ``metric`` given a % difference; None: never (a %)."""
    return PCT_FLOORS.get(STEP_METRICS[metric][1])


def _no_phases(label: str, analysis: Analysis) -> WorkloadInputError:
    n_ranges = analysis.summary.n_ranges
    why = (
        "the capture holds no NVTX ranges"
        if not n_ranges
        else f"none of its {n_ranges:,} NVTX ranges is a phase: pass --all-ranges, or "
        "--phase-map FILE.toml naming yours"
    )
    return WorkloadInputError(f"{label}: no phases to compare ({why})")


def run_metrics(label: str, analysis: Analysis) -> tuple[pl.DataFrame, bool]:
    """Per-step phase metrics of one run, and whether they cover the whole capture instead.

    A run with phases but no step index on any of them (no ``step`` range, no payload) gives
    one row per phase for the whole capture (``step`` 0) and ``True``. A run without GPUs has
    null GPU metrics (:func:`~analysis.aggregate.steps.step_phase_metrics`).
    """
    phases = analysis.phases
    if phases.is_empty():
        raise _no_phases(label, analysis)
    gpus = has_gpus(analysis.summary)
    if phases["step"].is_not_null().any():
        return step_phase_metrics(phases, has_gpus=gpus), False
    whole = phases.with_columns(pl.lit(0, dtype=pl.Int64).alias("step"))
    return step_phase_metrics(whole, has_gpus=gpus), True


def _check_comparable(metrics: dict[str, pl.DataFrame], whole: dict[str, bool]) -> None:
    """Refuse mixtures of per-step and whole-capture runs, and runs sharing no phase."""
    if len(set(whole.values())) > 1:
        stepped = [label for label, w in whole.items() if not w]
        unstepped = [label for label, w in whole.items() if w]
        raise WorkloadInputError(
            f"cannot compare {', '.join(stepped)} (per step) with {', '.join(unstepped)} "
            "(no step ranges: whole capture only); compare runs of one kind"
        )
    labels = list(metrics)
    keys = {label: set(frame.select(KEYS).rows()) for label, frame in metrics.items()}
    base = labels[0]
    for label in labels[1:]:
        if not keys[label] & keys[base]:
            raise WorkloadInputError(
                f"runs share no phase: {label} has {len(keys[label]):,} phase path(s) (e.g. "
                f"'{min(keys[label])[0]}'), {base} {len(keys[base]):,} (e.g. "
                f"'{min(keys[base])[0]}'), none in common; nothing to compare"
            )


def phase_order(metrics: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """``path, attribution, phase_order``: the phases in execution order across the runs.

    A phase's place is its start's offset from its step's start (median over steps, the
    earliest over runs, so a phase only one run has falls where it ran), then its depth and
    path; ``step`` itself comes first.
    """
    offsets = [
        per_step.with_columns(
            (pl.col("start_ns") - pl.col("start_ns").min().over("step")).alias("offset")
        )
        .group_by(KEYS)
        .agg(pl.col("offset").median())
        for per_step in metrics.values()
    ]
    return (
        pl.concat(offsets)
        .group_by(KEYS)
        .agg(pl.col("offset").min())
        .with_columns(pl.col("path").str.count_matches("/").alias("_depth"))
        .sort("offset", "_depth", "path", "attribution")
        .with_row_index("phase_order")
        .select(*KEYS, pl.col("phase_order").cast(pl.Int64))
    )


def _summary_table(
    metrics: dict[str, pl.DataFrame], order: dict[str, int], whole_capture: bool
) -> pl.DataFrame:
    """Each run's median, p10 and p90 per phase and metric, with diff, ratio and % to the first.

    ``diff_pct = (median − first run's median) / first run's median × 100`` and ``ratio``, only
    where the first run's median is at least the metric's ``pct_floor`` (:data:`PCT_FLOORS`;
    never for a percentage), else null. Rows in execution order (:func:`phase_order`).
    """
    base = next(iter(metrics))
    summaries = []
    for label, per_step in metrics.items():
        wide = over_steps(per_step)
        if whole_capture:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Int64).alias("n_steps"))
        for metric in STEP_METRICS:
            summaries.append(
                wide.select(
                    *KEYS,
                    pl.lit(metric).alias("metric"),
                    pl.lit(label).alias("run"),
                    "n_steps",
                    pl.col(metric).alias("median"),
                    pl.col(f"{metric}_p10").alias("p10"),
                    pl.col(f"{metric}_p90").alias("p90"),
                )
            )
    floors = pl.DataFrame(
        {"metric": list(STEP_METRICS), "pct_floor": [pct_floor(m) for m in STEP_METRICS]},
        schema={"metric": pl.String, "pct_floor": pl.Float64},
    )
    summary = (
        pl.concat(summaries)
        .with_columns(pl.col("run").replace_strict(order).alias("run_order"))
        .join(floors, on="metric", how="left")
    )
    reference = summary.filter(pl.col("run") == base).select(
        *KEYS, "metric", pl.col("median").alias("_base")
    )
    relative = pl.col("_base") >= pl.col("pct_floor")  # null floor or base: no relative diff
    return (
        summary.join(reference, on=[*KEYS, "metric"], how="left")
        .with_columns(
            (pl.col("median") - pl.col("_base")).alias("diff"),
            pl.when(relative).then(pl.col("median") / pl.col("_base")).alias("ratio"),
            pl.when(relative)
            .then((pl.col("median") - pl.col("_base")) / pl.col("_base") * 100)
            .alias("diff_pct"),
        )
        .drop("_base")
        .join(phase_order(metrics), on=KEYS, how="left")
        .sort("phase_order", "metric", "run_order")
    )


def _step_table(
    metrics: dict[str, pl.DataFrame], order: dict[str, int], whole_capture: bool
) -> pl.DataFrame:
    """Each run's value per step, phase and metric for the steps every run has, diff to the first."""
    base = next(iter(metrics))
    per_steps = [
        per_step.with_columns(pl.lit(label).alias("run")) for label, per_step in metrics.items()
    ]
    long = pl.concat(per_steps, how="diagonal_relaxed").unpivot(
        index=["step", *KEYS, "run"],
        on=list(STEP_METRICS),
        variable_name="metric",
        value_name="value",
    )
    common = (
        long.group_by("step")
        .agg(pl.col("run").n_unique())
        .filter(pl.col("run") == len(metrics))["step"]
    )
    if whole_capture:  # step 0 stands for the whole capture: no per-step comparison
        common = common.clear()
    steps = long.filter(pl.col("step").is_in(common.implode()))
    step_ref = steps.filter(pl.col("run") == base).select(
        "step", *KEYS, "metric", pl.col("value").alias("_base")
    )
    return (
        steps.join(step_ref, on=["step", *KEYS, "metric"], how="left")
        .with_columns((pl.col("value") - pl.col("_base")).alias("diff"))
        .drop("_base")
        .with_columns(pl.col("run").replace_strict(order).alias("run_order"))
        .sort("step", *KEYS, "metric", "run_order")
    )


def compare_runs(runs: dict[str, Analysis]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary, per-step) comparison tables in long form, differences against the first run.

    summary: ``path, attribution, metric, run, n_steps, median, p10, p90, run_order,
    pct_floor, diff, ratio, diff_pct, phase_order`` (rows in execution order; ``ratio`` and
    ``diff_pct`` null where the first run's median is below ``pct_floor``, see
    :data:`PCT_FLOORS`);
    steps: ``step, path, attribution, metric, run, value, diff`` for steps every run has.
    Runs without step ranges are compared over the whole capture (``n_steps`` null, ``steps``
    empty). Raises :class:`~analysis.errors.WorkloadInputError` when the runs cannot be compared.
    """
    if len(runs) < 2:
        raise WorkloadInputError("compare needs at least two runs")
    metrics: dict[str, pl.DataFrame] = {}
    whole: dict[str, bool] = {}
    for label, analysis in runs.items():
        metrics[label], whole[label] = run_metrics(label, analysis)
    _check_comparable(metrics, whole)
    whole_capture = whole[next(iter(runs))]
    order = {label: i for i, label in enumerate(runs)}  # the caller's order, first = reference
    return (
        _summary_table(metrics, order, whole_capture),
        _step_table(metrics, order, whole_capture),
    )
