"""Write a run comparison: compare.csv, compare_steps.csv, compare.md, compare.html, figures.

The tables are :func:`analysis.workload.compare.compare_runs`'s; this module only formats and
writes them (each file atomically). Per metric, each phase shows every run's median (p10–p90)
over steps, the difference to the first run in the metric's unit (percentage points for a
percentage) and in % of the first run's value; window (driver) phases first, then projection
(worker) ranges, each in execution order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analysis.aggregate.steps import STEP_METRICS
from analysis.model import Analysis
from analysis.render.compare_figures import comparison_figures
from analysis.render.files import atomic_write
from analysis.render.report_html import escape_md
from analysis.workload.compare import compare_runs

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


def _value(row: dict[str, Any], digits: int, spread: bool) -> str:
    if row["median"] is None:
        return "—"
    text = f"{row['median']:,.{digits}f}"
    if spread and row["p10"] is not None:
        text += f" ({row['p10']:,.{digits}f}–{row['p90']:,.{digits}f})"
    return text


def _diff(row: dict[str, Any] | None, digits: int, unit: str) -> tuple[str, str]:
    """(difference in the metric's unit, difference in %) to the first run; "—" when undefined."""
    if row is None or row["diff"] is None:
        return "—", "—"
    diff = f"{row['diff']:+,.{digits}f}" + (" pp" if unit == "%" else "")
    pct = "—" if row["diff_pct"] is None else f"{row['diff_pct']:+.1f}%"
    return diff, pct


def metric_table(rows: pl.DataFrame, runs: list[str], metric: str, spread: bool) -> TextTable:
    """One metric's rows as text: phase, scheme, each run, then each run's difference and %."""
    base = runs[0]
    unit = STEP_METRICS[metric][1]
    header = ["phase path", "scheme", *runs]
    for r in runs[1:]:
        header += [f"{r} − {base}" + (" (pp)" if unit == "%" else ""), f"{r} vs {base} (%)"]
    # one pass over the rows (a dict per phase, in order): thousands of phases stay fast
    phases: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    ordered = rows.with_columns((pl.col("attribution") != "window").alias("_projection"))
    for row in ordered.sort("_projection", "phase_order", "run_order").iter_rows(named=True):
        phases.setdefault((row["path"], row["attribution"]), {})[row["run"]] = row
    body = []
    for (path, attribution), cells in phases.items():
        digits = _digits(cells)
        line = [path, attribution]
        line += [_value(cells[r], digits, spread) if r in cells else "—" for r in runs]
        for r in runs[1:]:
            line += list(_diff(cells.get(r), digits, unit))
        body.append(line)
    return header, body


def metric_tables(summary: pl.DataFrame) -> list[tuple[str, TextTable]]:
    """(metric, table) for every metric of :data:`MARKDOWN_METRICS` with a value in some run."""
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    spread = summary["n_steps"].null_count() < summary.height
    tables = []
    for metric in MARKDOWN_METRICS:
        rows = summary.filter(pl.col("metric") == metric)
        if rows.is_empty() or rows["median"].null_count() == rows.height:
            continue
        tables.append((metric, metric_table(rows, runs, metric, spread)))
    return tables


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


def intro(runs: list[str], whole_capture: bool) -> str:
    """The comparison's opening lines (plain text): runs, reference, what the cells hold."""
    text = (
        f"Runs: {', '.join(runs)} (differences against {runs[0]}: in the metric's unit, "
        "and in % of its value). "
    )
    if whole_capture:
        return text + (
            "These runs have no step ranges: each phase is compared over the whole capture "
            "(one value per run)."
        )
    return text + "Cells: median over steps (p10–p90 over steps)."


def write_comparison(runs: dict[str, Analysis], out: str | Path) -> list[Path]:
    """compare.csv, compare_steps.csv, compare.md, compare.html and a figure per metric."""
    from analysis.render.compare_page import compare_html

    out = Path(out)
    summary, steps = compare_runs(runs)
    whole_capture = summary["n_steps"].null_count() == summary.height
    labels = list(runs)
    text = (
        "# nvtx-phases comparison\n\n"
        + escape_md(intro(labels, whole_capture))
        + "\n\n"
        + to_markdown(summary)
    )
    figures = comparison_figures(summary, out / "figures")
    page = compare_html(summary, labels, figures)
    return [
        atomic_write(out / "compare.csv", summary.write_csv),
        atomic_write(out / "compare_steps.csv", steps.write_csv),
        atomic_write(out / "compare.md", lambda p: p.write_text(text, encoding="utf-8")),
        atomic_write(out / "compare.html", lambda p: p.write_text(page, encoding="utf-8")),
        *figures,
    ]
