"""Write a run comparison: compare.csv, compare_steps.csv, compare.md, compare.html, figures.

Each file atomically; the text comes from :mod:`analysis.render.report.comparison`, the page from
:mod:`analysis.render.report.compare_page`, the figures from :mod:`analysis.render.figures.compare`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ...model import Analysis
from ...workload.compare import compare_runs
from ..figures.compare import comparison_figures
from ..report.compare_page import compare_html
from ..report.comparison import comparison_markdown, shown_metrics
from .atomic import atomic_write


def write_comparison(runs: dict[str, Analysis], out: str | Path) -> list[Path]:
    """compare.csv, compare_steps.csv, compare.md, compare.html and a figure per metric."""
    out = Path(out)
    summary, steps = compare_runs(runs)
    labels = list(runs)
    text = comparison_markdown(summary, labels)
    shown = shown_metrics(summary)  # no figure of a metric the pages leave out
    figures = comparison_figures(summary.filter(pl.col("metric").is_in(shown)), out / "figures")
    page = compare_html(summary, labels, figures)
    return [
        atomic_write(out / "compare.csv", summary.write_csv),
        atomic_write(out / "compare_steps.csv", steps.write_csv),
        atomic_write(out / "compare.md", lambda p: p.write_text(text, encoding="utf-8")),
        atomic_write(out / "compare.html", lambda p: p.write_text(page, encoding="utf-8")),
        *figures,
    ]
