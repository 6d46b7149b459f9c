"""HTML and Markdown pieces shared by ``report.html``/``report.md`` and ``compare.html``.

Every name here (NVTX ranges, kernels, labels, warnings) is free text from other people's
traces or command lines: :func:`escape_html` and :func:`escape_md` are applied to each before it
is written. Figures are embedded (``data:`` URIs), so a page is one self-contained file.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from .units import ReportTable

#: the folder (beside the report) holding each table of the report as CSV
TABLES_DIR = "tables"

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1320px; color: #222;
       padding: 0 1rem; line-height: 1.4; }
h1 { margin-bottom: 0.2rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.82rem; }
th, td { border: 1px solid #d4d4d4; padding: 0.2rem 0.45rem; text-align: right;
         font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { white-space: normal; } th { white-space: normal; }
th { background: #f3f3f3; vertical-align: bottom; }
td:first-child, th:first-child, td.text, th.text { text-align: left; }
.meta th { text-align: left; font-weight: 600; vertical-align: top; }
.meta td { text-align: left; white-space: normal; }
.scroll { overflow-x: auto; max-width: 100%; }
.note, .csv { color: #555; font-size: 0.82rem; margin: 0.2rem 0; }
figure { margin: 1.5rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 0.88rem; color: #333; margin-top: 0.3rem; }
.stands-out li { margin: 0.25rem 0; } .stands-out .omitted { color: #777; }
.warnings li { color: #8a5a00; }
"""

_MD_SPECIAL = re.compile(r"([\\`*\[\]<>&|])")


def escape_html(text: object) -> str:
    """``text`` safe inside HTML elements and attribute values."""
    return html.escape(str(text), quote=True)


def escape_md(text: object) -> str:
    """``text`` safe in a Markdown table cell or list item.

    Backslash-escapes what Markdown would read as markup (``|`` ends a cell, ``<`` opens raw
    HTML, ``*``, backticks and brackets format or link); newlines become spaces.
    """
    return _MD_SPECIAL.sub(r"\\\1", str(text)).replace("\r", " ").replace("\n", " ")


def csv_name(table: ReportTable) -> str:
    """The table's CSV path relative to the report: ``tables/<slug>.csv``."""
    return f"{TABLES_DIR}/{table.slug}.csv"


def html_table(table: ReportTable, *, link_csv: bool = True, level: int = 2) -> str:
    """``<hN>`` title, notes, the table (text columns left-aligned) and a link to its CSV."""
    e = escape_html
    text_cols = {i for i, c in enumerate(table.columns) if table.is_text(c)}
    head = "".join(
        f'<th class="text">{e(c.label)}</th>' if i in text_cols else f"<th>{e(c.label)}</th>"
        for i, c in enumerate(table.columns)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{e(v)}</td>' if i in text_cols else f"<td>{e(v)}</td>"
            for i, v in enumerate(row)
        )
        + "</tr>"
        for row in table.rows()
    )
    notes = "".join(f'<p class="note">{e(n)}</p>' for n in table.notes)
    link = (
        f'<p class="csv">CSV: <a href="{e(csv_name(table))}">{e(csv_name(table))}</a></p>'
        if link_csv
        else ""
    )
    grid = f'<div class="scroll"><table><tr>{head}</tr>{body}</table></div>' if body else ""
    return f"<h{level}>{e(table.title)}</h{level}>{notes}{grid}{link}"


def md_table(table: ReportTable, *, link_csv: bool = True, level: int = 2) -> list[str]:
    """The same table as Markdown lines (title, notes, rows, CSV link)."""
    m = escape_md
    lines = ["", f"{'#' * level} {m(table.title)}", ""]
    lines += [f"_{m(n)}_" for n in table.notes]
    if table.notes:
        lines.append("")
    if table.frame.height:
        lines.append("| " + " | ".join(m(c.label) for c in table.columns) + " |")
        aligns = ["---" if table.is_text(c) else "--:" for c in table.columns]
        lines.append("|" + "|".join(aligns) + "|")
        lines += ["| " + " | ".join(m(v) for v in row) + " |" for row in table.rows()]
    if link_csv:
        lines += ["", f"CSV: [{m(csv_name(table))}]({csv_name(table)})"]
    return lines


def figure_title(stem: str) -> str:
    """A figure's title from its file stem: ``busy_idle_per_phase`` → ``busy idle per phase``.

    One GPU pool's copy (``busy_idle_per_phase__pool-trainer``) reads ``busy idle per phase,
    pool trainer``.
    """
    base, sep, pool = stem.partition("__pool-")
    return base.replace("_", " ") + (f", pool {pool}" if sep else "")


#: CSS pixels per inch of figure: a 7.5-inch figure shows 825 px wide, whatever its dpi
FIGURE_CSS_PX_PER_INCH = 110


def figure_width(path: Path) -> int:
    """The width (CSS px) a PNG figure is shown at: its size in inches (from its dpi) × 110."""
    from PIL import Image

    with Image.open(path) as image:
        dpi = image.info.get("dpi", (100, 100))[0] or 100
        return round(image.width / float(dpi) * FIGURE_CSS_PX_PER_INCH)


def html_figure(path: Path, caption: str, title: str | None = None) -> str:
    """``<figure>`` with the PNG embedded, its title (default: from the file name) and caption.

    Both are escaped; ``title=""`` shows the caption alone.
    """
    e = escape_html
    data = base64.b64encode(path.read_bytes()).decode()
    title = figure_title(path.stem) if title is None else title
    parts = [f"<b>{e(title)}</b>" if title else "", e(caption) if caption else ""]
    text = ": ".join(p for p in parts if p)
    width = figure_width(path)
    return (
        f'<figure style="max-width: {width}px"><img alt="{e(path.stem)}" width="{width}" '
        f'src="data:image/png;base64,{data}"><figcaption>{text}</figcaption></figure>'
    )


def html_figures(figures: Iterable[Path], caption: Callable[[str], str]) -> str:
    """Every PNG of ``figures`` with ``caption(stem)`` under it."""
    return "".join(html_figure(p, caption(p.stem)) for p in figures if p.suffix == ".png")


def md_figures(figures: Iterable[Path], out: Path, caption: Callable[[str], str]) -> list[str]:
    """Every PNG of ``figures`` linked relative to ``out``, its caption in italics below."""
    lines: list[str] = []
    for p in figures:
        if p.suffix != ".png":
            continue
        lines += [f"![{escape_md(p.stem)}]({p.relative_to(out).as_posix()})", ""]
        text = caption(p.stem)
        lines += [
            f"*{escape_md(figure_title(p.stem))}*" + (f": {escape_md(text)}" if text else ""),
            "",
        ]
    return lines


def page(title: str, body: str) -> str:
    """A whole HTML page (UTF-8, inline CSS) around ``body``; ``title`` is escaped."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape_html(title)}</title>\n<style>{CSS}</style></head><body>\n"
        f"<h1>{escape_html(title)}</h1>\n{body}\n</body></html>\n"
    )
