"""``compare.html``: a run comparison as one self-contained page (figures embedded).

Per metric its figure with the caption, then its table (:func:`analysis.render.report.comparison.
metric_tables`). Run labels and range names are free text: every one is escaped.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ..figures.captions import compare_caption
from .comparison import has_graphs, intro, metric_tables, metric_title, without_gpu_metrics
from .html_page import escape_html, html_figure, page


def _table(header: list[str], body: list[list[str]]) -> str:
    e = escape_html
    head = "".join(
        f'<th class="text">{e(h)}</th>' if i < 2 else f"<th>{e(h)}</th>"
        for i, h in enumerate(header)
    )
    rows = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{e(c)}</td>' if i < 2 else f"<td>{e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in body
    )
    return f'<div class="scroll"><table><tr>{head}</tr>{rows}</table></div>'


def compare_html(summary: pl.DataFrame, runs: list[str], figures: list[Path]) -> str:
    """The page: intro, then per metric its figure (with caption) and its table."""
    e = escape_html
    whole_capture = summary["n_steps"].null_count() == summary.height
    pngs = {p.stem: p for p in figures if p.suffix == ".png"}
    parts = [
        f"<p>{e(intro(runs, whole_capture, has_graphs(summary), without_gpu_metrics(summary)))}</p>",
        '<p class="csv">Every phase and metric: <a href="compare.csv">compare.csv</a>; per '
        'step: <a href="compare_steps.csv">compare_steps.csv</a>.</p>',
    ]
    for metric, (header, body) in metric_tables(summary):
        parts.append(f"<h2>{e(metric_title(metric))}</h2>")
        figure = pngs.get(f"compare_{metric}")
        if figure is not None:
            parts.append(html_figure(figure, compare_caption(metric, whole_capture), title=""))
        parts.append(_table(header, body))
    return page("nvtx-phases comparison", "\n".join(parts))
