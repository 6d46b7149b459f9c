"""Step selection (``--steps``): one run's analysis restricted to some of its steps.

A spec is a comma-separated list of items, each a step ``N``, a range ``A:B`` that includes both
ends, or an open range ``A:`` (A and later) or ``:B`` (up to B); ``:`` is every step. Numbers are
the step indices of ``steps.csv`` and of the phase table's ``step`` column (VeRL numbers steps
from 1; ``step`` ranges without a payload are numbered from 0): labels, not positions, hence
inclusive ranges. ``2:3`` is steps 2 and 3; ``2:`` skips a warm-up step 1; ``1,3,7`` three steps.

:func:`select_steps` keeps, exactly as the whole run's analysis has them, the phase rows and
per-GPU phase rows, ranges and GPU metrics rows of the selected steps, their ``steps`` rows and
the GPU operations whose step
(``window_step``: the step of the window phase at the operation's start, else the step window
containing its start) is selected. From those operations it recounts the kernel table and the
summary's GPU totals: whole operations, each with the phase at its start (``window_path``;
``projection_path`` for the projection scheme) or unattributed. Those two parts come from one
column of the same rows, so they add up to the total by construction: they check nothing.
``gpu_time_conserved`` stays the whole run's, whose check compared independently computed
sides (:mod:`analysis.attribute.conservation`) over the attribution these rows carry; the
selected phase rows cannot serve as a side here (they are chosen by the step of the range,
the operations by the step at the operation's start, and window rows hold clipped time).
Operations of other steps or of no step are excluded and counted in a note (summary
warnings). Energy totals and power samples stay the whole run's; the phase rows carry the
selected steps' energy.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from typing import Any

import polars as pl

from ..aggregate.activity import operation_counts
from ..aggregate.phases import kernel_partial, kernel_table
from ..errors import InputError
from ..frames import int_value
from ..model import Analysis, GpuTotals, RunSummary
from ..step_spec import StepSpec, parse_steps, steps_text

__all__ = [
    "StepSpec",
    "available_steps",
    "parse_steps",
    "select_run",
    "select_steps",
    "steps_text",
]

#: the GPU activity columns a selection reads
_NEEDED = (
    "window_step",
    "window_path",
    "projection_path",
    "kind",
    "op_class",
    "name",
    "start_ns",
    "end_ns",
    "dur_ns",
    "bytes",
)


def available_steps(analysis: Analysis) -> list[int]:
    """The run's step indices: its step windows and the steps its phase rows carry."""
    found = set(analysis.steps["step"].drop_nulls().to_list()) if analysis.steps.height else set()
    if "step" in analysis.phases.columns:
        found |= set(analysis.phases["step"].drop_nulls().to_list())
    return sorted(int(s) for s in found)


def select_steps(analysis: Analysis, spec: str | StepSpec) -> Analysis:
    """``analysis`` restricted to the steps ``spec`` selects (see the module's docstring).

    The result shares ``analysis``'s temporary files: closing either removes them. A spec that
    matches no step, or an analysis without its GPU activity table (a folder whose
    ``gpu_activity.parquet`` is gone), is an :class:`InputError`.
    """
    spec = parse_steps(spec) if isinstance(spec, str) else spec
    available = available_steps(analysis)
    chosen = spec.picks(available)
    if not chosen:
        have = f"steps available: {steps_text(available)}" if available else "the run has no steps"
        raise InputError(f"--steps {spec.text!r} matches no step of this run ({have})")
    columns = analysis.gpu_activity.collect_schema().names()
    missing = [c for c in _NEEDED if c not in columns]
    if missing:
        raise InputError(
            f"--steps {spec.text}: the GPU activity table lacks {', '.join(missing)}; "
            "select steps on the run's traces or its analysis folder"
        )
    inside = pl.col("window_step").is_in(chosen).fill_null(False)
    activity = analysis.gpu_activity.filter(inside)
    phases = analysis.phases.filter(pl.col("step").is_in(chosen).fill_null(False))
    record = _record(analysis, spec, chosen, available, phases.height, inside)
    steps = analysis.steps.filter(pl.col("step").is_in(chosen))
    return dataclasses.replace(
        analysis,
        phases=phases,
        phase_devices=analysis.phase_devices.filter(pl.col("step").is_in(chosen).fill_null(False)),
        ranges=None
        if analysis.ranges is None
        else analysis.ranges.filter(pl.col("step").is_in(chosen).fill_null(False)),
        memory=None
        if analysis.memory is None
        else analysis.memory.filter(pl.col("step").is_in(chosen).fill_null(False)),
        gpu_metrics=None
        if analysis.gpu_metrics is None
        else analysis.gpu_metrics.filter(pl.col("step").is_in(chosen).fill_null(False)),
        idle_causes=None
        if analysis.idle_causes is None
        else analysis.idle_causes.filter(pl.col("step").is_in(chosen).fill_null(False)),
        staleness=None
        if analysis.staleness is None
        else analysis.staleness.filter(pl.col("step").is_in(chosen)),
        step_tokens=None
        if analysis.step_tokens is None
        else analysis.step_tokens.filter(pl.col("step").is_in(chosen)),
        gpu_activity=activity,
        kernels=_kernels(activity, analysis.kernels),
        steps=steps,
        summary=_summary(analysis.summary, activity, phases, steps.height, record),
    )


def select_run(run: Analysis, spec: str | StepSpec) -> Analysis:
    """:func:`select_steps` on a run handed over: ``run`` is closed when the selection fails."""
    with ExitStack() as on_error:
        on_error.callback(run.close)
        selected = select_steps(run, spec)
        on_error.pop_all()
    return selected


def _gpu_totals(activity: pl.LazyFrame, conserved: bool) -> GpuTotals:
    """The summary's GPU totals over these operations, whole, by the phase at their start.

    ``conserved``: the whole run's check (see the module's docstring).
    """
    dur = pl.col("dur_ns")
    window, projection = (
        pl.col("window_path").is_not_null(),
        pl.col("projection_path").is_not_null(),
    )
    row = (
        activity.select(
            dur.sum().alias("total_gpu_ns"),
            dur.filter(window).sum().alias("attributed_gpu_ns"),
            dur.filter(~window).sum().alias("unattributed_gpu_ns"),
            dur.filter(projection).sum().alias("projection_attributed_gpu_ns"),
            dur.filter(~projection).sum().alias("projection_unattributed_gpu_ns"),
            *operation_counts(),
        )
        .collect()
        .row(0, named=True)
    )
    counts = {name: int(value or 0) for name, value in row.items()}
    return GpuTotals(gpu_time_conserved=conserved, **counts)


def _kernels(activity: pl.LazyFrame, like: pl.DataFrame) -> pl.DataFrame:
    """The kernel table of these operations, with the whole run's column types."""
    ops = (
        activity.filter(pl.col("kind").is_in(["kernel", "graph"]))
        .select("kind", "name", "op_class", "start_ns", "end_ns")
        .collect()
    )
    table = kernel_table([kernel_partial(ops)])
    types = {c: t for c, t in like.schema.items() if c in table.columns}
    return table.cast(types)  # type: ignore[arg-type]


def _record(
    analysis: Analysis,
    spec: StepSpec,
    chosen: list[int],
    available: list[int],
    kept_rows: int,
    inside: pl.Expr,
) -> dict[str, Any]:
    """What the selection kept and excluded (``summary.json``'s ``selection``, and a note)."""
    dur, no_step = pl.col("dur_ns"), pl.col("window_step").is_null()
    out = (
        analysis.gpu_activity.filter(~inside)
        .select(
            pl.len().alias("excluded_gpu_ops"),
            dur.sum().alias("excluded_gpu_ns"),
            no_step.sum().alias("excluded_no_step_gpu_ops"),
            dur.filter(no_step).sum().alias("excluded_no_step_gpu_ns"),
        )
        .collect()
        .row(0, named=True)
    )
    return {
        "spec": spec.text,
        "steps": chosen,
        "available_steps": available,
        "not_found": [s for s in spec.named() if s not in available],
        **{name: int_value(value) if value is not None else 0 for name, value in out.items()},
        "excluded_phase_rows": analysis.phases.height - kept_rows,
        "gpu_totals": "whole operations of the selected steps, by the phase at their start; "
        "gpu_time_conserved is the whole run's check",
        "energy_totals": "whole run" if analysis.summary.energy is not None else None,
    }


def _summary(
    summary: RunSummary,
    activity: pl.LazyFrame,
    phases: pl.DataFrame,
    n_steps: int,
    record: dict[str, Any],
) -> RunSummary:
    r = record
    missing = f"; no step {steps_text(r['not_found'])}" if r["not_found"] else ""
    ms = r["excluded_gpu_ns"] / 1e6, r["excluded_no_step_gpu_ns"] / 1e6
    note = (
        f"--steps {r['spec']!r} selected {len(r['steps'])} of {len(r['available_steps'])} "
        f"steps ({steps_text(r['steps'])}){missing}; excluded {r['excluded_gpu_ops']:,} GPU "
        f"operation(s), {ms[0]:.3f} ms, outside them ({r['excluded_no_step_gpu_ops']:,}, "
        f"{ms[1]:.3f} ms, in no step) and {r['excluded_phase_rows']:,} phase row(s); GPU "
        "totals count whole operations by the step and phase at their start"
        + ("; energy totals are the whole run's" if summary.energy is not None else "")
    )
    return dataclasses.replace(
        summary,
        gpu=_gpu_totals(activity, summary.gpu.gpu_time_conserved),
        n_steps=n_steps,
        n_phase_ranges=int(phases["n_ranges"].sum()) if phases.height else 0,
        warnings=[*summary.warnings, note],
        selection=record,
    )
