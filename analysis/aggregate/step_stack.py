"""Per-step phase tables for the phase figures: sums per phase, and the stack of each step.

The phases of a step and its wall time are those of :mod:`analysis.aggregate.shares` (one
definition: a segment of the stack over its bar is the phase's share of the step); a step cut at
the capture's end (:func:`~analysis.aggregate.shares.cut_steps`) has no bar, as it has no share.
"""

from __future__ import annotations

import polars as pl

from ..errors import InputError
from ..step_spec import parse_steps, steps_text
from .shares import inside_step, step_phase_walls

MAX_STEP_BARS = 40
"""Beyond this many steps, ``phase_time_per_step`` draws binned steps (their mean), not one bar each."""
OTHER = "other (no phase)"
#: the sums :func:`step_phases` carries per (step, phase)
SUMMED = ("wall_ns", "gpu_busy_ns", "idle_ns", "nccl_ns", "memcpy_ns", "memcpy_bytes", "energy_j")


def step_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """Per (step, phase of the step): :data:`SUMMED` over processes and GPUs, first start.

    ``has_energy``: whether any row measured energy. Totals over all GPUs (busy, idle, NCCL,
    memcpy); a step's own wall time per phase is :func:`~analysis.aggregate.shares.step_phase_walls`.
    """
    return (
        inside_step(phases)
        .group_by("step", "canonical")
        .agg(
            *(pl.col(c).sum() for c in SUMMED),
            pl.col("energy_j").is_not_null().any().alias("has_energy"),
            pl.col("start_ns").min(),
        )
        .sort("step", "start_ns")
    )


def phase_totals(phases: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``canonical`` and ``columns`` summed over all steps (:func:`step_phases`), execution order."""
    return (
        step_phases(phases)
        .group_by("canonical")
        .agg(*(pl.col(c).sum() for c in columns), pl.col("start_ns").min())
        .sort("start_ns", "canonical")
        .drop("start_ns")
    )


_STACK_SCHEMA = {
    "bar": pl.String,
    "first_step": pl.Int64,
    "last_step": pl.Int64,
    "n_steps": pl.Int64,
    "position": pl.Int64,
    "canonical": pl.String,
    "wall_ms": pl.Float64,
    "bottom_ms": pl.Float64,
}


def step_stack(phases: pl.DataFrame, max_bars: int = MAX_STEP_BARS) -> pl.DataFrame:
    """Wall ms per (bar, phase) of the per-step stack, with an ``other (no phase)`` segment.

    A segment is the phase's wall time in the step (:func:`step_phase_walls`: the mean per
    ``step`` range where several mark the step); ``other`` is the step's wall time minus its
    phases', where that is positive, so a bar adds up to its step. Up to ``max_bars`` steps,
    one bar per step; beyond, steps are cut into ``max_bars`` consecutive bins and each bar is
    the bin's mean per step (a phase absent from a step counts 0 there; means add up as the
    steps do). Columns: ``bar`` (label), ``first_step``, ``last_step``, ``n_steps`` (in the
    bar), ``position`` (0: bottom; phases by first start, ``other`` on top), ``canonical``,
    ``wall_ms``, ``bottom_ms`` (where the segment starts). Steps cut at the capture's end
    (:func:`~analysis.aggregate.shares.cut_steps`) are left out.
    """
    data = step_phase_walls(phases)
    if data.is_empty():
        return pl.DataFrame(schema=_STACK_SCHEMA)
    per_step = data.select("step", "canonical", "wall_ns")
    other = (
        data.group_by("step")
        .agg(pl.col("wall_ns").sum().alias("phases_ns"), pl.col("step_wall_ns").first())
        .select(
            "step",
            pl.lit(OTHER).alias("canonical"),
            (pl.col("step_wall_ns") - pl.col("phases_ns")).alias("wall_ns"),
        )
        .filter(pl.col("wall_ns") > 0)
    )
    order = data.group_by("canonical").agg(pl.col("start_ns").min()).sort("start_ns", "canonical")
    names = [*order["canonical"], OTHER]
    positions = pl.DataFrame({"canonical": names, "position": range(len(names))})
    bins = _bins(data["step"].unique().sort().to_list(), max_bars, data.schema["step"])
    return (
        pl.concat([per_step, other])
        .join(bins, on="step")
        .group_by("bar", "first_step", "last_step", "n_steps", "canonical")
        .agg((pl.col("wall_ns").sum() / pl.col("n_steps").first() / 1e6).alias("wall_ms"))
        .join(positions, on="canonical")
        .sort("first_step", "position")
        .with_columns(
            (pl.col("wall_ms").cum_sum().over("first_step") - pl.col("wall_ms")).alias("bottom_ms")
        )
        .select(list(_STACK_SCHEMA))
        .cast(_STACK_SCHEMA)  # type: ignore[arg-type]
    )


def _bins(steps: list[int], max_bars: int, dtype: pl.DataType) -> pl.DataFrame:
    """``step, bar, first_step, last_step, n_steps``: ``steps`` in at most ``max_bars`` bins.

    ``steps[k]`` goes to bin ``k * n_bins // len(steps)``: consecutive, sizes differing by at
    most one; a bin is labelled by its step, or ``first–last``.
    """
    n_bins = min(max_bars, len(steps))
    frame = pl.DataFrame(
        {"step": steps, "bin": [k * n_bins // len(steps) for k in range(len(steps))]},
        schema={"step": dtype, "bin": pl.Int64},
    )
    return (
        frame.with_columns(
            pl.col("step").min().over("bin").alias("first_step"),
            pl.col("step").max().over("bin").alias("last_step"),
            pl.len().over("bin").cast(pl.Int64).alias("n_steps"),
        )
        .with_columns(
            pl.when(pl.col("first_step") == pl.col("last_step"))
            .then(pl.col("first_step").cast(pl.String))
            .otherwise(pl.format("{}–{}", "first_step", "last_step"))
            .alias("bar")
        )
        .drop("bin")
    )


#: the most steps ``--detail-steps`` may choose (one panel each of ``power_timeline_detail``)
MAX_DETAIL_STEPS = 4
_OPTION = "--detail-steps"


def step_windows(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps table as ``step, start_ns, end_ns, dur_ns``, by step."""
    if steps.is_empty() or "step_start_ns" not in steps.columns:
        return pl.DataFrame(schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    return (
        steps.select(
            "step", pl.col("step_start_ns").alias("start_ns"), pl.col("step_end_ns").alias("end_ns")
        )
        .drop_nulls()
        .with_columns(dur_ns=pl.col("end_ns") - pl.col("start_ns"))
        .sort("step")
    )


def default_detail_steps(windows: pl.DataFrame) -> dict[int, str]:
    """The median-duration step (the lower median) and the longest step, with their role."""
    if windows.is_empty():
        return {}
    ranked = windows.sort("dur_ns", "step")["step"].to_list()
    median, longest = ranked[(len(ranked) - 1) // 2], ranked[-1]
    if median == longest:
        return {median: "median and longest"}
    return dict(sorted({median: "median duration", longest: "longest"}.items()))


def resolve_detail_steps(windows: pl.DataFrame, spec: str | None) -> dict[int, str]:
    """The steps to draw in detail, each with its role in the title; ``spec`` as ``--steps``.

    None: :func:`default_detail_steps`. A step the run lacks, a spec matching none, or more
    than :data:`MAX_DETAIL_STEPS` steps is a one-line :class:`InputError`.
    """
    if not spec:
        return default_detail_steps(windows)
    try:
        parsed = parse_steps(spec)
    except InputError as exc:
        raise InputError(str(exc).replace("--steps", _OPTION, 1)) from exc
    available = windows["step"].to_list()
    have = f"steps available: {steps_text(available)}" if available else "the run has no steps"
    missing = [s for s in parsed.named() if s not in available]
    if missing:
        raise InputError(f"{_OPTION} {spec!r}: no step {steps_text(missing)} ({have})")
    chosen = parsed.picks(available)
    if not chosen:
        raise InputError(f"{_OPTION} {spec!r} matches no step of this run ({have})")
    if len(chosen) > MAX_DETAIL_STEPS:
        raise InputError(
            f"{_OPTION} {spec!r} chooses {len(chosen)} steps; the detail shows at most "
            f"{MAX_DETAIL_STEPS} (e.g. {steps_text(chosen[:2])})"
        )
    return {s: "chosen" for s in chosen}


def check_detail_steps(steps: pl.DataFrame, spec: str | None) -> None:
    """Fail early (before writing anything) when ``spec`` names steps the run lacks."""
    if spec:
        resolve_detail_steps(step_windows(steps), spec)
