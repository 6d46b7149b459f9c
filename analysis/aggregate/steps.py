"""Per-step phase metrics and their spread over steps, shared by the report and run comparison.

Within a step, a phase marked by several processes lasts as long as its slowest process
(wall = max) and uses the time, bytes and energy of all (sums).

``gpu_busy_pct`` is the row's own scheme's busy share: every device's work inside a window
(driver) phase; for a projection (worker) range only the work that range's own thread launched.
``process_gpu_busy_pct`` (projection rows only, from ``process_gpu_busy_ns``/``process_idle_ns``
where the phase table has them) is the busy share of the GPUs the range's process used, counting
every operation that process launched, on any thread.

A run without GPUs (a CPU-only capture: ``n_devices`` 0 in its summary) has only wall times: every
other metric (:data:`GPU_METRICS`) is null, "not available", never 0.

A phase row with a range cut at the capture's end (:data:`~analysis.model.CUT`) has no true wall
time: it is left out of the metrics per step, hence of the medians over steps
(:func:`cut_note` says so).
"""

from __future__ import annotations

import polars as pl

from ..model import RunSummary
from .shares import cut_steps, is_cut

#: metric column → (label, unit)
STEP_METRICS: dict[str, tuple[str, str]] = {
    "wall_ms": ("wall time", "ms"),
    "gpu_busy_pct": ("GPU busy (projection: own launches)", "%"),
    "process_gpu_busy_pct": ("process GPU busy (projection)", "%"),
    "kernel_ms": ("kernel time", "ms"),
    "gpu_time_ms": ("GPU time (kernels + CUDA graphs)", "ms"),
    "nccl_ms": ("NCCL kernel time", "ms"),
    "memcpy_ms": ("memcpy time", "ms"),
    "memcpy_mb": ("memcpy volume", "MB"),
    "energy_j": ("energy", "J"),
    "avg_power_w": ("average power", "W"),
    "energy_above_idle_j": ("energy above idle", "J"),
}

#: the metrics that need a GPU in the capture (all but wall time): null for a run without GPUs
GPU_METRICS: tuple[str, ...] = tuple(m for m in STEP_METRICS if m != "wall_ms")

#: the phase-table columns behind ``process_gpu_busy_pct`` (absent from older analyses)
PROCESS_COLUMNS = ("process_gpu_busy_ns", "process_idle_ns")


def _process_busy_pct(columns: list[str]) -> pl.Expr:
    """Σ process busy / Σ (wall × devices the process used); null without the columns."""
    if not all(c in columns for c in PROCESS_COLUMNS):
        return pl.lit(None, dtype=pl.Float64)
    busy = pl.col("process_gpu_busy_ns").cast(pl.Float64)
    # process_idle_ns = wall × devices − busy, so busy + idle is the process's GPU-time capacity
    capacity = (busy + pl.col("process_idle_ns").cast(pl.Float64)).sum()
    return pl.when(busy.is_not_null().any() & (capacity > 0)).then(busy.sum() / capacity * 100)


def group_keys(phases: pl.DataFrame) -> list[str]:
    """A phase's keys over steps: ``step, path, attribution``, and ``pool`` in a run with pools."""
    return ["step", "path", "attribution", *(["pool"] if "pool" in phases.columns else [])]


def _known_sum(column: pl.Expr) -> pl.Expr:
    """The sum, null when a row's value is unknown (GPU work not captured), never a partial 0."""
    return pl.when(column.is_null().any()).then(None).otherwise(column.sum())


def step_phase_metrics(phases: pl.DataFrame, *, has_gpus: bool) -> pl.DataFrame:
    """One row per (step, path, attribution[, pool]) with every metric of :data:`STEP_METRICS`.

    Rows cut at the capture's end are left out (:func:`cut_note`). A metric of a row whose
    GPU work was not captured (null: :mod:`analysis.attribute.not_captured`) stays null.
    ``has_gpus``: the capture saw a GPU (:func:`has_gpus`); without, :data:`GPU_METRICS` are
    null (a CPU-only run launched no kernels because there was no GPU, not in 0 ms).
    """
    with_energy = pl.col("energy_j").is_not_null().any()
    graph = pl.col("graph_ns") if "graph_ns" in phases.columns else pl.lit(0)
    keys = group_keys(phases)
    return (
        phases.filter(pl.col("step").is_not_null() & ~is_cut(phases))
        .sort(*keys, "trace", "pid")  # float sums in a fixed order
        .group_by(*keys)
        .agg(
            (pl.col("wall_ns").max() / 1e6).alias("wall_ms"),
            (
                _known_sum(pl.col("gpu_busy_ns"))
                / (pl.col("wall_ns") * pl.col("n_devices")).sum()
                * 100
            ).alias("gpu_busy_pct"),
            _process_busy_pct(phases.columns).alias("process_gpu_busy_pct"),
            (_known_sum(pl.col("kernel_ns")) / 1e6).alias("kernel_ms"),
            (_known_sum(pl.col("kernel_ns") + graph) / 1e6).alias("gpu_time_ms"),
            (_known_sum(pl.col("nccl_ns")) / 1e6).alias("nccl_ms"),
            (_known_sum(pl.col("memcpy_ns")) / 1e6).alias("memcpy_ms"),
            (_known_sum(pl.col("memcpy_bytes")) / 1e6).alias("memcpy_mb"),
            pl.when(with_energy).then(pl.col("energy_j").sum()).alias("energy_j"),
            pl.when(pl.col("energy_above_idle_j").is_not_null().any())
            .then(pl.col("energy_above_idle_j").sum())
            .alias("energy_above_idle_j"),
            pl.col("start_ns").min(),
        )
        .with_columns((pl.col("energy_j") / (pl.col("wall_ms") / 1e3)).alias("avg_power_w"))
        .with_columns(pl.col("gpu_busy_pct").fill_nan(None))
        .with_columns(
            [] if has_gpus else [pl.lit(None, dtype=pl.Float64).alias(m) for m in GPU_METRICS]
        )
        .sort("step", "start_ns")
    )


def has_gpus(summary: RunSummary) -> bool:
    """Whether the run's capture saw a GPU (``n_devices`` > 0): its GPU metrics mean something."""
    return summary.n_devices > 0


def over_steps(per_step: pl.DataFrame) -> pl.DataFrame:
    """Per (path, attribution[, pool]): step count, and median, p10, p90 of each metric."""
    aggs = [pl.len().cast(pl.Int64).alias("n_steps"), pl.col("start_ns").min()]
    for metric in STEP_METRICS:
        aggs += [
            pl.col(metric).median().alias(metric),
            pl.col(metric).quantile(0.1, "linear").alias(f"{metric}_p10"),
            pl.col(metric).quantile(0.9, "linear").alias(f"{metric}_p90"),
        ]
    keys = group_keys(per_step)[1:]
    return per_step.group_by(*keys).agg(aggs).sort("start_ns", *keys[:1]).drop("start_ns")


#: why a range cut at the capture's end has no true duration (said once per output)
CUT_WHY = (
    "nsys closes a range still open when the capture stops (its process exited before its last "
    "NVTX events were flushed, or was still running), so its duration runs to the capture's "
    "end, not to its own end"
)


def _steps_text(steps: list[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def cut_note(phases: pl.DataFrame) -> str | None:
    """One sentence: the phase rows cut at the capture's end, and what they are left out of.

    Their rows are left out of the medians over steps (:func:`step_phase_metrics`); a step whose
    ``step`` range (or a phase of it) is cut, out of the shares of the step and the per-step
    stack (:func:`~analysis.aggregate.shares.cut_steps`). None when nothing is cut.
    """
    cut = phases.filter(is_cut(phases))
    if cut.is_empty():
        return None
    per_step = (
        cut.group_by("step")
        .agg(pl.col("path").unique().sort())
        .sort("step", nulls_last=True)
        .iter_rows()
    )
    named = "; ".join(
        f"{'no step' if step is None else f'step {step}'}: {', '.join(paths)}"
        for step, paths in per_step
    )
    text = (
        f"cut at the capture's end: {cut.height} phase row(s) ({named}) hold a range that ends "
        f"exactly at the end of the capture: {CUT_WHY}; these rows are left "
        "out of the medians over steps"
    )
    marked = set(phases.filter(pl.col("path") == "step")["step"].drop_nulls().to_list())
    steps = [s for s in cut_steps(phases) if s in marked]
    if steps:
        text += f", and {_steps_text(steps)} out of the shares of the step (no true wall time)"
        if len(steps) == len(marked):
            text += ": every step is cut, so no share of the step is given"
    return text + "."
