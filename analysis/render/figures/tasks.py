"""Which figures a run gets, as tasks for :class:`~analysis.render.figures.drawing.Drawing`.

Nothing here imports matplotlib: the tasks name their drawing functions, which the worker
processes (or this one, without workers) import. A task returns every file it wrote (each
figure's PNG, SVG and ``NAME.csv`` of the numbers drawn), which the caller records in the
output folder's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .drawing import FigureTask

if TYPE_CHECKING:
    import polars as pl

    from ...model import Analysis

_FIGURES = "nvtx_phases.analysis.render.figures.phases"
_LENGTHS = "nvtx_phases.analysis.render.figures.lengths"
_POOLS = "nvtx_phases.analysis.render.figures.pools"


def per_pool(name: str, pools: list[str], args: tuple[pl.DataFrame | Path, ...]) -> list[Path]:
    """The phase figure ``name`` once per GPU pool, each over that pool's rows only.

    A pool whose rows have no ``step`` range but the rollouter's ``version`` ranges (the
    rollout axis) is drawn with its versions as the figures' steps (the caption says so).
    """
    import polars as pl

    from nvtx_phases.naming import PATH_SEP, STEP, VERSION

    from . import phases as figures
    from .pool_scope import for_pool

    def as_steps(frame: pl.DataFrame) -> pl.DataFrame:
        if "path" not in frame.columns or (frame["path"] == STEP).any():
            return frame
        if not (frame["path"] == VERSION).any():
            return frame
        path = pl.col("path")
        renamed = [
            pl.when(path == VERSION)
            .then(pl.lit(STEP))
            .otherwise(path.str.replace(f"^{VERSION}{PATH_SEP}", STEP + PATH_SEP))
            .alias("path")
        ]
        if "canonical" in frame.columns:
            renamed.append(pl.col("canonical").replace(VERSION, STEP))
        return frame.with_columns(renamed)

    drawn: list[Path] = []
    for pool in pools:
        mine = tuple(
            as_steps(a.filter(pl.col("pool") == pool))
            if isinstance(a, pl.DataFrame) and "pool" in a.columns
            else a
            for a in args
        )
        with for_pool(pool):
            drawn += getattr(figures, name)(*mine)
    return drawn


def phase_figure_tasks(
    analysis: Analysis, out: Path, *, detail_steps: str | None = None
) -> list[FigureTask]:
    """The phase figures (time, share, busy/idle, data movement, energy) and the power timelines.

    In the order a report shows them. The power samples travel once, in one task drawing both
    power figures (they are the only large table a figure needs).
    """
    phases = analysis.phases
    names = ("phase_time_per_step", "phase_share", "busy_idle_per_phase", "data_movement_per_phase")
    if "pool" in phases.columns:  # an asynchronous run: each figure once per GPU pool
        pools = sorted(set(phases["pool"].drop_nulls().to_list()))
        tasks = [FigureTask(f"{__name__}:per_pool", (name, pools, (phases, out))) for name in names]
        tasks.append(
            FigureTask(
                f"{__name__}:per_pool",
                ("energy_figure", pools, (analysis.phase_devices, phases, out)),
            )
        )
        if analysis.idle_causes is not None and not analysis.idle_causes.is_empty():
            tasks.append(FigureTask(f"{_POOLS}:idle_by_cause_figure", (analysis.idle_causes, out)))
    else:
        tasks = [FigureTask(f"{_FIGURES}:{name}", (phases, out)) for name in names]
        tasks.append(FigureTask(f"{_FIGURES}:energy_figure", (analysis.phase_devices, phases, out)))
    samples = analysis.power_samples
    if samples is not None and not samples.is_empty():
        tasks.append(
            FigureTask(
                f"{__name__}:power_figures", (phases, samples, analysis.steps, out, detail_steps)
            )
        )
    return tasks


def envelope_task(envelope: pl.DataFrame, out: Path) -> FigureTask:
    """``figures/power_envelope``: see :func:`analysis.render.figures.envelope.power_envelope_figure`."""
    return FigureTask(
        "nvtx_phases.analysis.render.figures.envelope:power_envelope_figure", (envelope, out)
    )


def length_figure_tasks(
    responses: pl.DataFrame, tails: pl.DataFrame, out: Path, cap: int | None
) -> list[FigureTask]:
    """The response-length CDF and heatmap and the straggler timeline."""
    return [
        FigureTask(f"{_LENGTHS}:length_cdf", (responses, out), {"cap": cap}),
        FigureTask(f"{_LENGTHS}:length_heatmap", (responses, out), {"cap": cap}),
        FigureTask(f"{_LENGTHS}:straggler_timeline", (tails, out)),
    ]


def power_figures(
    phases: pl.DataFrame,
    samples: pl.DataFrame,
    steps: pl.DataFrame,
    out: Path,
    detail_steps: str | None = None,
) -> list[Path]:
    """Both power figures, from one copy of the samples: the overview, then the detail."""
    from .power import power_timeline, power_timeline_detail

    return power_timeline(phases, samples, out) + power_timeline_detail(
        phases, samples, steps, out, detail_steps
    )
