"""A readable report of one analysis: ``report.html`` (self-contained) and ``report.md``.

NVTX range names, paths and warnings are free text from other people's traces: every one is
escaped (``html.escape`` in HTML, pipes and backslashes in Markdown) before it is written.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import polars as pl

from analysis.aggregate.steps import over_steps, step_phase_metrics
from analysis.model import PROJECTION, Analysis
from analysis.render.files import atomic_write

SUMMARY_COLUMNS = [
    ("path", "phase path", None),
    ("attribution", "attribution", None),
    ("n_steps", "steps", "{:d}"),
    ("wall_ms", "wall ms (median)", "{:,.2f}"),
    ("wall_ms_p10", "p10", "{:,.2f}"),
    ("wall_ms_p90", "p90", "{:,.2f}"),
    ("busy_pct", "GPU busy %", "{:.0f}"),
    ("nccl_ms", "NCCL ms", "{:,.2f}"),
    ("memcpy_mb", "memcpy MB", "{:,.1f}"),
    ("energy_j", "energy J (median)", "{:,.3f}"),
    ("energy_j_p10", "p10", "{:,.3f}"),
    ("energy_j_p90", "p90", "{:,.3f}"),
    ("avg_power_w", "avg W", "{:,.0f}"),
    ("energy_above_idle_j", "J above idle", "{:,.3f}"),
]


def phase_summary(phases: pl.DataFrame) -> pl.DataFrame:
    """Per phase path and attribution: median and p10–p90 over steps."""
    return over_steps(step_phase_metrics(phases)).rename({"gpu_busy_pct": "busy_pct"})


def _cell(value: object, fmt: str | None) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return fmt.format(value) if fmt else str(value)


def _metadata(analysis: Analysis) -> list[tuple[str, str]]:
    s = analysis.summary
    gpu, energy = s.gpu, s.energy
    return [
        (
            "traces",
            ", ".join(f"{t.label} (nsys {t.nsys_version}, host {t.host or '?'})" for t in s.traces),
        ),
        (
            "GPUs",
            ", ".join(s.gpus) or f"{s.n_devices} device(s), model not in the export",
        ),
        ("NVIDIA driver", ", ".join(s.driver_versions) or "not in the export"),
        (
            "ranks (processes launching GPU work)",
            str(analysis.phases.filter(pl.col("attribution") == PROJECTION)["pid"].n_unique()),
        ),
        ("steps", str(s.n_steps)),
        ("GPU operations", f"{gpu.n_gpu_ops:,}"),
        (
            "GPU time",
            f"{gpu.total_gpu_ns / 1e6:,.2f} ms: {gpu.attributed_gpu_ns / 1e6:,.2f} ms in phases, "
            f"{gpu.unattributed_gpu_ns / 1e6:,.2f} ms unattributed (window scheme)",
        ),
        (
            "energy",
            f"{energy.total_energy_j:,.3f} J: {energy.attributed_energy_j:,.3f} J in phases, "
            f"{energy.unattributed_energy_j:,.3f} J unattributed (source {energy.power_source}, "
            f"sampling every {(energy.power_interval_ns or 0) / 1e6:.2f} ms)"
            if energy is not None
            else "no power samples",
        ),
    ]


Section = tuple[str, pl.DataFrame]


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "" if value != value else f"{value:,.4g}"
    return "" if value is None else str(value)


def to_markdown(
    analysis: Analysis, figures: list[Path], out: Path, sections: list[Section] | None = None
) -> str:
    """The report as Markdown (figures linked relative to ``out``)."""

    def md(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    lines = ["# nvtx-phases report", ""]
    lines += [f"- **{md(k)}**: {md(v)}" for k, v in _metadata(analysis)]
    table = phase_summary(analysis.phases)
    lines += ["", "## Phases (over steps)", ""]
    lines.append("| " + " | ".join(label for _, label, _ in SUMMARY_COLUMNS) + " |")
    lines.append("|" + "---|" * len(SUMMARY_COLUMNS))
    for row in table.iter_rows(named=True):
        lines.append("| " + " | ".join(md(_cell(row[c], f)) for c, _, f in SUMMARY_COLUMNS) + " |")
    for title, frame in sections or []:
        lines += ["", f"## {md(title)}", "", "| " + " | ".join(md(c) for c in frame.columns) + " |"]
        lines.append("|" + "---|" * len(frame.columns))
        lines += ["| " + " | ".join(md(_fmt(v)) for v in row) + " |" for row in frame.iter_rows()]
    lines += ["", "## Figures", ""]
    lines += [
        f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in figures if p.suffix == ".png"
    ]
    if analysis.warnings:
        lines += ["", "## Warnings", ""] + [f"- {md(w)}" for w in analysis.warnings]
    return "\n".join(lines) + "\n"


def to_html(analysis: Analysis, figures: list[Path], sections: list[Section] | None = None) -> str:
    """The report as one self-contained HTML page (figures embedded)."""
    e = html.escape
    meta = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _metadata(analysis))
    table = phase_summary(analysis.phases)
    head = "".join(f"<th>{e(label)}</th>" for _, label, _ in SUMMARY_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(_cell(row[c], f))}</td>" for c, _, f in SUMMARY_COLUMNS) + "</tr>"
        for row in table.iter_rows(named=True)
    )
    images = "".join(
        f'<figure><img alt="{e(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{e(p.stem.replace("_", " "))}</figcaption></figure>'
        for p in figures
        if p.suffix == ".png"
    )
    warnings = "".join(f"<li>{e(w)}</li>" for w in analysis.warnings)
    extra = "".join(
        f"<h2>{e(title)}</h2><table><tr>"
        + "".join(f"<th>{e(c)}</th>" for c in frame.columns)
        + "</tr>"
        + "".join(
            "<tr>" + "".join(f"<td>{e(_fmt(v))}</td>" for v in row) + "</tr>"
            for row in frame.iter_rows()
        )
        + "</table>"
        for title, frame in sections or []
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>nvtx-phases report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; margin: 1rem 0; font-size: 0.85rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: right; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
figure {{ display: inline-block; margin: 0.5rem; }} img {{ max-width: 720px; }}
.warnings li {{ color: #8a5a00; }}
</style></head><body>
<h1>nvtx-phases report</h1>
<table>{meta}</table>
<h2>Phases (median and p10–p90 over steps)</h2>
<table><tr>{head}</tr>{body}</table>
{extra}
<h2>Figures</h2>{images}
<h2>Warnings</h2><ul class="warnings">{warnings or "<li>none</li>"}</ul>
</body></html>
"""


def write_report(
    analysis: Analysis, out: str | Path, figures: list[Path], sections: list[Section] | None = None
) -> list[Path]:
    """Write ``report.html`` and ``report.md`` under ``out`` (``sections``: extra tables)."""
    out = Path(out)
    text_md = to_markdown(analysis, figures, out, sections)
    text_html = to_html(analysis, figures, sections)
    return [
        atomic_write(out / "report.html", lambda p: p.write_text(text_html, encoding="utf-8")),
        atomic_write(out / "report.md", lambda p: p.write_text(text_md, encoding="utf-8")),
    ]
