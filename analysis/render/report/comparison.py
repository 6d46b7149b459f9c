"""A run comparison as text: ``compare.md``'s intro and tables.

The tables are :func:`analysis.workload.compare.compare_runs`'s; this module only formats them
(the page and the files: :mod:`analysis.render.outputs.compare_files`). Per metric, each phase shows every run's median (p10–p90)
over steps, the difference to the first run in the metric's unit (percentage points for a
percentage) and in % of the first run's value where that value is at least the metric's floor
(:data:`analysis.workload.compare.PCT_FLOORS`, stated once in the intro; below it the % cell
is empty); window (driver) phases first, then projection (worker) ranges, each in execution
order. A number that rounds to zero prints as ``0``, never ``-0.000``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from ...aggregate.steps import GPU_METRICS, STEP_METRICS
from ...workload.compare import FLOOR_TEXT, KEYS
from .html_page import escape_md

#: the metrics ``compare.md`` shows, in order (those without a value in any run are left out)
MARKDOWN_METRICS = tuple(STEP_METRICS)

#: a table of one metric: header cells and rows of text cells
TextTable = tuple[list[str], list[list[str]]]


def _digits(cells: dict[str, dict[str, Any]]) -> int:
    """Decimals for one phase's row from its largest value: about four significant digits."""
    largest = max(
        (
            abs(float(r[c]))
            for r in cells.values()
            for c in ("median", "p10", "p90")
            if r[c] is not None
        ),
        default=0.0,
    )
    if largest >= 1000:
        return 0
    return 1 if largest >= 100 else 2 if largest >= 1 or largest == 0 else 3


def number(value: float, digits: int, *, sign: bool = False) -> str:
    """``value`` with ``digits`` decimals, signed with ``sign``; ``0`` where it rounds to zero.

    So no ``-0.000`` or ``+0.00`` is ever printed.
    """
    if round(value, digits) == 0:
        return "0"
    return f"{value:+,.{digits}f}" if sign else f"{value:,.{digits}f}"


def _value(row: dict[str, Any], digits: int, spread: bool) -> str:
    if row["median"] is None:
        return "—"
    text = number(row["median"], digits)
    if spread and row["p10"] is not None:
        text += f" ({number(row['p10'], digits)}–{number(row['p90'], digits)})"
    return text


def _diff(row: dict[str, Any] | None, digits: int, unit: str) -> tuple[str, str]:
    """(difference in the metric's unit, difference in %) to the first run.

    "—" where a run lacks the phase; the % is empty where the first run's value is below the
    metric's floor (``diff_pct`` null).
    """
    if row is None or row["diff"] is None:
        return "—", "—"
    diff = number(row["diff"], digits, sign=True) + (" pp" if unit == "%" else "")
    pct = "" if row["diff_pct"] is None else number(row["diff_pct"], 1, sign=True) + "%"
    return diff, pct


def metric_table(rows: pl.DataFrame, runs: list[str], metric: str, spread: bool) -> TextTable:
    """One metric's rows as text: phase, scheme, each run, then each run's difference and %.

    A percentage metric (GPU busy) differs in percentage points only: no % column.
    """
    base = runs[0]
    unit = STEP_METRICS[metric][1]
    relative = unit != "%"
    header = ["phase path", "scheme", *runs]
    for r in runs[1:]:
        header.append(f"{r} − {base}" + (" (pp)" if unit == "%" else ""))
        header += [f"{r} vs {base} (%)"] if relative else []
    # one pass over the rows (a dict per phase, in order): thousands of phases stay fast
    phases: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    ordered = rows.with_columns((pl.col("attribution") != "window").alias("_projection"))
    for row in ordered.sort("_projection", "phase_order", "run_order").iter_rows(named=True):
        phases.setdefault((row["path"], row["attribution"]), {})[row["run"]] = row
    body = []
    for (path, attribution), cells in phases.items():
        if all(row["median"] is None for row in cells.values()):
            continue  # no run has it (process GPU busy of a window phase): compare.csv only
        digits = _digits(cells)
        line = [path, attribution]
        line += [_value(cells[r], digits, spread) if r in cells else "—" for r in runs]
        for r in runs[1:]:
            diff, pct = _diff(cells.get(r), digits, unit)
            line += [diff, pct] if relative else [diff]
        body.append(line)
    return header, body


def has_graphs(summary: pl.DataFrame) -> bool:
    """Whether any run has CUDA-graph time (GPU time then differs from kernel time)."""

    def median(metric: str) -> pl.DataFrame:
        rows = summary.filter(pl.col("metric") == metric)
        return rows.select(*KEYS, "run", pl.col("median").fill_null(0).alias(metric))

    both = median("kernel_ms").join(median("gpu_time_ms"), on=[*KEYS, "run"], how="inner")
    return bool((both["gpu_time_ms"] != both["kernel_ms"]).any())


def without_gpu_metrics(summary: pl.DataFrame) -> list[str]:
    """The runs (in order) without a value of any GPU metric: their GPU cells are "—".

    A capture without GPUs (or none of whose GPU work was captured): not available.
    """
    gpu = summary.filter(pl.col("metric").is_in(GPU_METRICS))
    known = gpu.group_by("run").agg(pl.col("median").is_not_null().any().alias("known"))
    order = summary.select("run", "run_order").unique().sort("run_order")["run"].to_list()
    unknown = set(known.filter(~pl.col("known"))["run"].to_list())
    return [r for r in order if r in unknown]


def shown_metrics(summary: pl.DataFrame) -> list[str]:
    """The metrics of :data:`MARKDOWN_METRICS` with a value in some run, in order.

    GPU time (kernels + CUDA graphs) is left out where no run has CUDA graphs: it equals kernel
    time there (compare.csv keeps both).
    """
    with_values = set(summary.filter(pl.col("median").is_not_null())["metric"].unique().to_list())
    graphs = has_graphs(summary)
    return [m for m in MARKDOWN_METRICS if m in with_values and (graphs or m != "gpu_time_ms")]


def metric_tables(summary: pl.DataFrame) -> list[tuple[str, TextTable]]:
    """(metric, table) for every metric of :func:`shown_metrics`."""
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    spread = summary["n_steps"].null_count() < summary.height
    return [
        (metric, metric_table(summary.filter(pl.col("metric") == metric), runs, metric, spread))
        for metric in shown_metrics(summary)
    ]


def metric_title(metric: str) -> str:
    """``wall time (ms)``."""
    label, unit = STEP_METRICS[metric]
    return f"{label} ({unit})"


def to_markdown(summary: pl.DataFrame) -> str:
    """Per metric, a table per phase: each run's median (p10–p90), difference and % to the first."""
    if summary.is_empty():
        return ""
    lines: list[str] = []
    for metric, (header, body) in metric_tables(summary):
        lines += [f"### {metric_title(metric)}", ""]
        lines.append("| " + " | ".join(escape_md(h) for h in header) + " |")
        lines.append("|---|---|" + "--:|" * (len(header) - 2))
        lines += ["| " + " | ".join(escape_md(c) for c in row) + " |" for row in body]
        lines.append("")
    return "\n".join(lines)


def floors_text() -> str:
    """The % floors, stated once: ``at least 1 µs (times), 1 KB (volumes), …``."""
    kinds = {"ms": "times", "MB": "volumes", "J": "energies", "W": "powers"}
    return ", ".join(f"{FLOOR_TEXT[u]} ({kinds[u]})" for u in kinds)


def intro(
    runs: list[str], whole_capture: bool, graphs: bool = True, no_gpu: Sequence[str] = ()
) -> str:
    """The comparison's opening lines (plain text): runs, reference, what the cells hold.

    ``no_gpu``: runs without any GPU metric (:func:`without_gpu_metrics`), named once.
    """
    text = (
        f"Runs: {', '.join(runs)} (differences against {runs[0]}: in the metric's unit, "
        f"and in % of its value where that value is at least {floors_text()}; below, the % is "
        "left empty; GPU busy differs in percentage points). GPU busy of a worker (projection) "
        "range counts only the work its own thread launched; process GPU busy, every "
        "operation of its process. "
    )
    if no_gpu:
        text += (
            f"No GPU metrics for {', '.join(no_gpu)}: not available (no GPU in the capture, or "
            "its GPU work not captured); only wall times, the GPU cells are —. "
        )
    if not graphs:
        text += "No CUDA graphs in these runs: GPU time equals kernel time (both in compare.csv). "
    if whole_capture:
        return text + (
            "These runs have no step ranges: each phase is compared over the whole capture "
            "(one value per run)."
        )
    return text + "Cells: median over steps (p10–p90 over steps)."


def comparison_markdown(summary: pl.DataFrame, labels: list[str]) -> str:
    """``compare.md``: the intro (runs, the floors of the %, what cells hold), then each table."""
    whole_capture = summary["n_steps"].null_count() == summary.height
    return (
        "# nvtx-phases comparison\n\n"
        + escape_md(intro(labels, whole_capture, has_graphs(summary), without_gpu_metrics(summary)))
        + "\n\n"
        + to_markdown(summary)
    )
