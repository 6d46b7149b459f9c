"""``study``'s report.html (self-contained) and report.md: axes, runs, figures, left-out runs."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ...workload.compare import KEYS
from ...workload.study import Study
from ...workload.study_metrics import STUDY_METRICS
from ...workload.study_sources import RECORDS
from ..figures.captions import caption_for
from .html_page import escape_html, escape_md, html_figures, md_figures, page

#: what each figure answers, by stem (the report's section text)
QUESTIONS: dict[str, str] = {
    "study_phase_signature": "Where does each policy's step go, in time and in energy?",
    "study_reward_cost": "What does the reward paradigm cost (time, energy, bytes, idle power)?",
    "study_lengths": "How does the task shape response lengths (skew, stragglers, imbalance)?",
    "study_scaling": "How do step time, energy per sample and each phase scale with GPUs?",
    "study_token_energy": "What does a token cost in energy, phase by phase?",
}


def workload_table(tidy: pl.DataFrame) -> pl.DataFrame:
    """One row per run, one column per run-scope metric it has (lengths: their own table)."""
    names = [m.name for m in STUDY_METRICS if m.scope == "run" and m.source != "lengths"]
    rows = tidy.filter(pl.col("metric").is_in(names))
    if rows.is_empty():
        return pl.DataFrame()
    wide = rows.pivot(on="metric", index="run", values="value", aggregate_function="first")
    return wide.select("run", *(n for n in names if n in wide.columns))


def _run_rows(study: Study, left: dict[str, str]) -> list[list[str]]:
    rows = []
    for run in study.runs:
        axes = [str(run.axes.get(a, "—")) for a in study.axes]
        status = f"left out: {left[run.label]}" if run.label in left else "compared"
        rows.append([run.label, *axes, status])
    return rows


def write_study_report(
    study: Study,
    tidy: pl.DataFrame,
    lengths: pl.DataFrame,
    left: dict[str, str],
    not_drawn: dict[str, str],
    figures: list[Path],
    out: Path,
) -> list[Path]:
    """Write ``report.html`` and ``report.md`` under ``out``; return their paths."""
    e, m = escape_html, escape_md
    header = ["run", *study.axes, "status"]
    rows = _run_rows(study, left)
    n_phases = tidy.filter(pl.col("attribution") != RECORDS).select(KEYS).unique().height
    intro = (
        f"{tidy['run'].n_unique()} of {len(study.runs)} run(s) in the study; {n_phases} phase(s) "
        "compared, each between the runs that have it; table: study.csv (run × phase × metric, "
        "axes as columns, input: trace, verl_log or records), metric definitions: "
        "study_metrics.csv."
    )
    pngs = [p for p in figures if p.suffix == ".png"]
    html = [f'<p class="note">{e(intro)}</p>', '<h2>Runs</h2><div class="scroll"><table>']
    html.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
    html += [
        "<tr>" + "".join(f'<td class="text">{e(c)}</td>' for c in row) + "</tr>" for row in rows
    ]
    html.append("</table></div>")
    md = [f"# {m(study.title)}", "", m(intro), "", "## Runs", ""]
    md.append("| " + " | ".join(m(h) for h in header) + " |")
    md.append("|" + "---|" * len(header))
    md += ["| " + " | ".join(m(c) for c in row) + " |" for row in rows]
    md.append("")
    for p in pngs:
        question = QUESTIONS.get(p.stem, p.stem)
        html += [f"<h2>{e(question)}</h2>", html_figures([p], caption_for)]
        md += [f"## {m(question)}", "", *md_figures([p], out, caption_for)]
    for title, table in (
        ("Response lengths per run", lengths),
        ("Workload per run (records and logs; medians over steps)", workload_table(tidy)),
    ):
        if table.is_empty():
            continue
        html.append(f'<h2>{e(title)}</h2><div class="scroll"><table><tr>')
        html.append("".join(f"<th>{e(c)}</th>" for c in table.columns) + "</tr>")
        md += [f"## {m(title)}", ""]
        md.append("| " + " | ".join(m(c) for c in table.columns) + " |")
        md.append("|" + "---|" * table.width)
        for row in table.rows():
            cells = [c if isinstance(c, str) else ("—" if c is None else f"{c:.4g}") for c in row]
            html.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
            md.append("| " + " | ".join(m(c) for c in cells) + " |")
        html.append("</table></div>")
        md.append("")
    if not_drawn:
        html.append("<h2>Not drawn</h2><ul>")
        html += [f"<li>{e(q)}: {e(why)}</li>" for q, why in not_drawn.items()]
        html.append("</ul>")
        md += ["## Not drawn", "", *[f"- {m(q)}: {m(why)}" for q, why in not_drawn.items()], ""]
    if left:
        html.append('<h2>Left out</h2><ul class="warnings">')
        html += [f"<li>{e(k)}: {e(v)}</li>" for k, v in left.items()]
        html.append("</ul>")
        md += ["## Left out", "", *[f"- {m(k)}: {m(v)}" for k, v in left.items()], ""]
    html_path, md_path = out / "report.html", out / "report.md"
    html_path.write_text(page(study.title, "\n".join(html)), encoding="utf-8")
    md_path.write_text("\n".join(md), encoding="utf-8")
    return [html_path, md_path]
