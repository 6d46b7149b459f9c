"""Write what-if bounds: ``whatif.csv`` (per step), ``whatif.md`` (over the run), a figure.

The tables come finished from :mod:`analysis.workload.whatif`; nothing here computes a bound.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ...workload.whatif_pipeline import OVERLAP_FORMULA
from ...workload.whatif_texts import ENERGY_RULE, OVERLAP, WHOLE_STEP
from ..outputs.atomic import atomic_write
from .units import fixed

#: the run-level columns the Markdown table and the CLI show, with their headers
RUN_HEADERS = (
    "bound",
    "variant",
    "steps",
    "median saving / step",
    "median %",
    "run saving",
    "run %",
    "energy saving",
)
#: beyond this many steps the figure draws bins of consecutive steps (their median), not each step
MAX_POINTS = 40
#: the figure's canvas (inches), whatever the number of steps and bounds
CANVAS = (8.0, 4.0)


def format_seconds(value: float | None) -> str:
    """``12.35 s``, ``61.22 ms``, ``850 µs`` or ``0 s``; ``–`` for None."""
    if value is None:
        return "–"
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f} s"
    if size >= 1:
        return f"{value:.2f} s"
    if size >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.0f} µs" if size >= 0.5e-6 else "0 s"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{fixed(value, 1, pct=True)}%"


def _joules(value: float | None) -> str:
    if value is None:
        return "–"
    return (
        f"{value:,.0f} J"
        if abs(value) >= 100
        else f"{value:.2f} J"
        if abs(value) >= 1
        else f"{value:.3f} J"
    )


def run_rows(run: pl.DataFrame) -> list[tuple[str, ...]]:
    """The run-level table as text cells, in :data:`RUN_HEADERS` order."""
    return [
        (
            r["bound"],
            r["variant"],
            str(r["steps"]),
            format_seconds(r["median_saving_s"]),
            _pct(r["median_saving_pct"]),
            format_seconds(r["saving_s"]),
            _pct(r["run_saving_pct"]),
            _joules(r["energy_saving_j"]),
        )
        for r in run.iter_rows(named=True)
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def whatif_markdown(run: pl.DataFrame, source: str, warnings: list[str] | None = None) -> str:
    """``whatif.md``: the run-level table, warnings, every bound's assumption (or why missing)."""
    lines = [
        "# What-if bounds",
        "",
        f"Phase times: {_cell(source)}. Each bound is an upper bound on the saving: what the step "
        "would take under the assumption written below it, from measured times. `saving %` is of "
        "the measured time (the step's, or for a `balanced_dp` phase row the phase's); `run` sums "
        "the steps the bound is available for.",
        "",
        "| " + " | ".join(RUN_HEADERS) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(RUN_HEADERS))) + "|",
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in run_rows(run)]
    if warnings:
        lines += ["", "## Warnings", "", *(f"- {_cell(w)}" for w in warnings)]
    lines += [
        "",
        "## The overlap bound over the run",
        "",
        f"`{OVERLAP}` treats the steps as a pipeline, with its fill and drain: "
        f"{_cell(OVERLAP_FORMULA)}. Its run total is this schedule's length; the saving is the "
        "measured steps' total minus it.",
    ]
    lines += ["", "## Assumptions", ""]
    seen: set[str] = set()
    for r in run.iter_rows(named=True):
        text = r["assumption"]
        if r["bound"] == "balanced_dp" and r["variant"] != WHOLE_STEP:
            if text in seen:
                continue
            label = "`balanced_dp` (each phase)"
        else:
            label = f"`{r['bound']}` / `{_cell(r['variant'])}`"
        seen.add(text)
        lines.append(f"- {label}: {_cell(text)}")
    lines += ["", f"Energy: {ENERGY_RULE}.", ""]
    return "\n".join(lines)


def _binned(steps: pl.DataFrame, max_points: int) -> pl.DataFrame:
    """``steps`` with ``x``: the step, or past ``max_points`` steps the mean step of its bin."""
    order = steps.select(pl.col("step").unique().sort())
    n = order.height
    if n <= max_points:
        return steps.with_columns(pl.col("step").cast(pl.Float64).alias("x"))
    # the k-th step goes to bin k * max_points // n: consecutive, sizes differing by at most one
    bins = order.with_row_index("_k").select(
        "step", (pl.col("_k").cast(pl.Int64) * max_points // n).alias("_bin")
    )
    centre = bins.group_by("_bin").agg(pl.col("step").mean().cast(pl.Float64).alias("x"))
    return steps.join(bins, on="step").join(centre, on="_bin").drop("_bin")


def _quantiles(frame: pl.DataFrame, column: str, *keys: str) -> pl.DataFrame:
    """Median, p10 and p90 of ``column`` per ``x`` (and ``keys``), sorted by ``x``."""
    return (
        frame.group_by("x", *keys)
        .agg(
            pl.col(column).median().alias("mid"),
            pl.col(column).quantile(0.1, "linear").alias("low"),
            pl.col(column).quantile(0.9, "linear").alias("high"),
        )
        .sort("x")
    )


def _step_label(n_steps: int, max_points: int) -> str:
    """The x label: ``step``, or past ``max_points`` steps the bins' size (``24–25 steps``)."""
    if n_steps <= max_points:
        return "step"
    low, high = n_steps // max_points, -(-n_steps // max_points)
    size = f"{low}" if low == high else f"{low}–{high}"
    return f"step (median per bin of {size} steps)"


def _plotted(table: pl.DataFrame) -> pl.DataFrame:
    """The rows the figure draws: step-level bounds that are available."""
    return table.filter(
        pl.col("bound_s").is_not_null()
        & ((pl.col("bound") != "balanced_dp") | (pl.col("variant") == WHOLE_STEP))
    )


def whatif_figure_data(table: pl.DataFrame, *, max_points: int = MAX_POINTS) -> pl.DataFrame:
    """The numbers :func:`whatif_figure` draws: one row per line (``series``) and point.

    ``series``: ``measured`` or ``bound / variant``; ``x``: the step, or past ``max_points``
    steps the mean step of its bin; ``y``: the step time (s), a bin's median; ``p10``, ``p90``:
    the measured time's band over a bin (drawn, and given, only when binned).
    """
    steps = _plotted(table)
    if steps.is_empty():
        columns = {"series": pl.String, **dict.fromkeys(("x", "y", "p10", "p90"), pl.Float64)}
        return pl.DataFrame(schema=columns)
    points = _binned(steps, max_points)
    binned = steps["step"].n_unique() > max_points
    measured = _quantiles(
        points.group_by("step", "x").agg(pl.col("measured_s").first()), "measured_s"
    ).with_columns(pl.lit("measured").alias("series"))
    bounds = _quantiles(points, "bound_s", "bound", "variant").with_columns(
        pl.format("{} / {}", "bound", "variant").alias("series"),
        pl.lit(None, pl.Float64).alias("low"),
        pl.lit(None, pl.Float64).alias("high"),
    )
    order = [
        "measured",
        *(
            f"{b} / {v}"
            for b, v in steps.select("bound", "variant").unique(maintain_order=True).iter_rows()
        ),
    ]
    band = [pl.col(c) if binned else pl.lit(None, pl.Float64) for c in ("low", "high")]
    frame = pl.concat(
        [
            f.select(
                "series", "x", pl.col("mid").alias("y"), band[0].alias("p10"), band[1].alias("p90")
            )
            for f in (measured, bounds)
        ]
    )
    rank = pl.DataFrame({"series": order}).with_row_index("_k")
    return frame.join(rank, on="series").sort("_k", "x").drop("_k")


def whatif_figure(table: pl.DataFrame, out: Path, *, max_points: int = MAX_POINTS) -> list[Path]:
    """Measured step time and each step-level bound, per step (``whatif_per_step``).

    A fixed :data:`CANVAS`; past ``max_points`` steps, the median over bins of consecutive steps
    with the measured time's p10–p90 band. Legend outside the axes, on the right. The drawn
    numbers (:func:`whatif_figure_data`) go beside it as ``whatif_per_step.csv``.
    """
    from matplotlib.ticker import MaxNLocator

    from ..figures.phases import plt, save_figure  # matplotlib only when drawing

    data = whatif_figure_data(table, max_points=max_points)
    if data.is_empty():
        return []
    n_steps = _plotted(table)["step"].n_unique()
    binned = n_steps > max_points
    fig, ax = plt.subplots(figsize=CANVAS)
    for k, series in enumerate(data["series"].unique(maintain_order=True)):
        rows = data.filter(pl.col("series") == series)
        if series == "measured":
            marker = "" if binned else "o"
            ax.plot(rows["x"], rows["y"], color="black", marker=marker, lw=2, label=series)
            if binned:
                ax.fill_between(
                    rows["x"],
                    rows["p10"],
                    rows["p90"],
                    color="#999999",
                    alpha=0.3,
                    lw=0,
                    label="measured, p10–p90\nover the bin's steps",
                )
            continue
        marker = "" if binned else "."  # k − 1: the bounds keep colours C0, C1, … in order
        ax.plot(rows["x"], rows["y"], marker=marker, color=f"C{(k - 1) % 10}", lw=1.2, label=series)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(_step_label(n_steps, max_points))
    ax.set_ylabel("step time (s)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"What-if: step time under each bound ({n_steps} steps)", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out, "whatif_per_step", data=data)


def write_whatif(
    table: pl.DataFrame,
    run: pl.DataFrame,
    out: Path,
    *,
    source: str,
    figures: bool = True,
    warnings: list[str] | None = None,
) -> list[Path]:
    """Write ``whatif.csv``, ``whatif.md`` and (``figures``) the figure to ``out``; the paths."""
    text = whatif_markdown(run, source, warnings)
    written = [
        atomic_write(out / "whatif.csv", table.write_csv),
        atomic_write(out / "whatif.md", lambda p: p.write_text(text, encoding="utf-8")),
    ]
    if figures:
        written += whatif_figure(table, out / "figures")
    return written
