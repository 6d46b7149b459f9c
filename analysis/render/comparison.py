"""Write a run comparison: ``compare.csv``, ``compare_steps.csv``, ``compare.md`` and figures.

The tables are :func:`analysis.workload.compare.compare_runs`'s; this module only formats and
writes them (each file atomically).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from analysis.aggregate.steps import STEP_METRICS
from analysis.model import Analysis
from analysis.render.compare_figures import comparison_figures
from analysis.render.files import atomic_write
from analysis.workload.compare import compare_runs

#: the metrics ``compare.md`` shows, in order (all of them are in ``compare.csv``)
MARKDOWN_METRICS = ("wall_ms", "energy_j", "avg_power_w", "memcpy_mb", "nccl_ms")


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:,.3f}"


def _metric_table(rows: pl.DataFrame, runs: list[str]) -> list[str]:
    """Markdown table rows of one metric: each run's median (p10–p90), differences to the first."""
    base = runs[0]
    header = ["phase path", "attribution", *runs, *(f"{r} − {base}" for r in runs[1:])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    # one pass over the rows (a dict per phase, in first-seen order): thousands of phases
    # (--all-ranges) stay fast
    phases: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows.iter_rows(named=True):
        phases.setdefault((row["path"], row["attribution"]), {})[row["run"]] = row
    for (path, attribution), cells in phases.items():
        values = [
            f"{_fmt(cells[r]['median'])} ({_fmt(cells[r]['p10'])}–{_fmt(cells[r]['p90'])})"
            if r in cells
            else ""
            for r in runs
        ]
        diffs = [_fmt(cells[r]["diff"]) if r in cells else "" for r in runs[1:]]
        name = str(path).replace("|", "\\|")
        lines.append("| " + " | ".join([name, attribution, *values, *diffs]) + " |")
    return lines


def to_markdown(summary: pl.DataFrame, metrics: tuple[str, ...] = MARKDOWN_METRICS) -> str:
    """Side-by-side table per phase: each run's median (p10–p90) and the difference to the first."""
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    if not runs:
        return ""
    lines: list[str] = []
    for metric in metrics:
        rows = summary.filter(pl.col("metric") == metric)
        if rows["median"].null_count() == rows.height:
            continue
        label, unit = STEP_METRICS[metric]
        lines += [f"### {label} ({unit})", ""]
        lines += _metric_table(rows, runs)
        lines.append("")
    return "\n".join(lines)


def write_comparison(runs: dict[str, Analysis], out: str | Path) -> list[Path]:
    """compare.csv, compare_steps.csv, compare.md and one figure per metric under ``out``."""
    out = Path(out)
    summary, steps = compare_runs(runs)
    scope = (
        "These runs have no step ranges: each phase is compared over the whole capture "
        "(one value per run).\n\n"
        if summary["n_steps"].null_count() == summary.height
        else ""
    )
    text = (
        "# nvtx-phases comparison\n\nRuns: "
        + ", ".join(runs)
        + f" (differences against {next(iter(runs))})\n\n"
        + scope
        + to_markdown(summary)
    )
    return [
        atomic_write(out / "compare.csv", summary.write_csv),
        atomic_write(out / "compare_steps.csv", steps.write_csv),
        atomic_write(out / "compare.md", lambda p: p.write_text(text, encoding="utf-8")),
        *comparison_figures(summary, out / "figures"),
    ]
