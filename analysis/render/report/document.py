"""A readable report of one analysis: ``report.html`` (self-contained) and ``report.md``.

Run metadata, "what stands out" (:mod:`analysis.render.report.findings`), the phase table as
median and p10–p90 over steps, the extra sections (top kernels, lengths, stragglers), the
figures with their captions (:func:`analysis.render.figures.captions.caption_for`) and the warnings.
Every table is in human units (:mod:`analysis.render.report.units`: ms/s, MB, J, W, never raw
ns) and is also written as CSV beside the report (``tables/<name>.csv``, linked from both).

NVTX range names, paths and warnings are free text from other people's traces: every one is
escaped (:mod:`analysis.render.report.html_page`) before it is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from ...aggregate.steps import PROCESS_COLUMNS, has_gpus, over_steps, step_phase_metrics
from ...model import PROJECTION, WINDOW, Analysis
from ..figures.captions import caption_for
from ..outputs.atomic import atomic_write
from .findings import Finding, what_stands_out
from .html_page import (
    csv_name,
    escape_html,
    escape_md,
    html_figures,
    html_table,
    md_figures,
    md_table,
    page,
)
from .units import ReportTable, Section, humanize

#: an extra report section from another module: (title, table in the analysis' own columns)

PHASE_TABLE_TITLE = "Phase summary (median and p10–p90 over steps)"
#: the phase table's columns (from :func:`phase_summary`) and their headers
PHASE_COLUMNS: dict[str, str] = {
    "path": "phase path",
    "attribution": "attribution",
    "n_steps": "steps",
    "wall_ms": "wall time",
    "wall_ms_p10": "p10",
    "wall_ms_p90": "p90",
    "gpu_busy_pct": "GPU busy",
    "busy_own_launches_pct": "busy, own launches",
    "process_gpu_busy_pct": "process GPU busy",
    "kernel_ms": "kernel time",
    "gpu_time_ms": "GPU time (kernel + graph)",
    "nccl_ms": "NCCL",
    "memcpy_ms": "memcpy time",
    "memcpy_mb": "memcpy volume",
    "energy_j": "energy",
    "energy_j_p10": "p10",
    "energy_j_p90": "p90",
    "avg_power_w": "avg power",
    "energy_above_idle_j": "energy above idle",
}


def phase_summary(analysis: Analysis) -> pl.DataFrame:
    """Per phase path and attribution (execution order): median and p10–p90 over steps.

    A run without step ranges (no phase has a step index) gives one value per phase over the
    whole capture, ``n_steps`` null; a run without GPUs, null GPU metrics.
    """
    phases, gpus = analysis.phases, has_gpus(analysis.summary)
    if phases.height and phases["step"].null_count() == phases.height:
        whole = phases.with_columns(pl.lit(0, dtype=pl.Int64).alias("step"))
        summary = over_steps(step_phase_metrics(whole, has_gpus=gpus))
        return summary.with_columns(pl.lit(None, dtype=pl.Int64).alias("n_steps"))
    return over_steps(step_phase_metrics(phases, has_gpus=gpus))


#: the phase table's columns that need GPU work (left out of a CPU-only capture's table)
GPU_COLUMNS = (
    "gpu_busy_pct",
    "busy_own_launches_pct",
    "process_gpu_busy_pct",
    "kernel_ms",
    "gpu_time_ms",
    "nccl_ms",
    "memcpy_ms",
    "memcpy_mb",
)

SCHEME_NOTE = (
    "A phase marked by several processes lasts as long as its slowest one and uses the "
    "energy of all; kernel, GPU, NCCL and memcpy times add up over GPUs and processes. "
    "window (driver phases): GPU busy is the work of every device inside the "
    "phase. projection (worker ranges): work launched inside the range (NVIDIA's definition); "
    "'busy, own launches' counts only what the range's own thread launched (PyTorch's autograd "
    "thread, for one, launches backward kernels outside any range), so it is no measure of how "
    "idle the GPU was; 'process GPU busy' counts every operation the range's process launched, "
    "on the GPUs it used."
)


#: in a run with GPU pools the window scheme counts the phase's own pool's GPUs
POOL_FROM = "GPU busy is the work of every device inside the phase"
POOL_TO = "GPU busy is the work of the GPUs of the phase's pool (its GPU pool column) inside it"
assert POOL_FROM in SCHEME_NOTE


def _by_scheme(summary: pl.DataFrame) -> pl.DataFrame:
    """GPU busy split by what it counts.

    Window rows keep ``gpu_busy_pct`` (every device's work); projection rows get
    ``busy_own_launches_pct`` instead (the work the range's own thread launched, only).
    """
    projection = pl.col("attribution") == PROJECTION
    return summary.with_columns(
        pl.when(projection).then(pl.col("gpu_busy_pct")).alias("busy_own_launches_pct"),
        pl.when(pl.col("attribution") == WINDOW).then(pl.col("gpu_busy_pct")).alias("gpu_busy_pct"),
    )


def no_phases_reason(analysis: Analysis) -> str:
    """Why a run has no phase rows, in one sentence."""
    n_ranges = analysis.summary.n_ranges
    if not n_ranges:
        return "No phases: the capture holds no NVTX ranges."
    return (
        f"No phases: none of the capture's {n_ranges:,} NVTX ranges is a phase (analyze with "
        "--all-ranges, or --phase-map FILE.toml naming yours)."
    )


def _gpu_time_notes(frame: pl.DataFrame, analysis: Analysis) -> tuple[pl.DataFrame, list[str]]:
    """The frame without GPU time where no phase has CUDA-graph time, and the notes.

    GPU time (kernel + graph) equals kernel time without graphs; a note says where worker
    ranges lack process GPU busy (an analysis without ``process_gpu_busy_ns``).
    """
    notes = []
    if (frame["gpu_time_ms"] != frame["kernel_ms"]).any():
        notes.append(
            "GPU time = kernel time + whole CUDA graph executions (--cuda-graph-trace=graph "
            "records a graph, not its kernels)."
        )
    else:
        frame = frame.drop("gpu_time_ms")
    has_workers = (frame["attribution"] == PROJECTION).any()
    if has_workers and not all(c in analysis.phases.columns for c in PROCESS_COLUMNS):
        notes.append(
            "No process GPU busy: this analysis has no process_gpu_busy_ns column (re-run "
            "nvtx-phases analyze with this version)."
        )
    return frame, notes


def phase_table(summary: pl.DataFrame, analysis: Analysis) -> ReportTable:
    """The phase table in display units; metrics without a value in any row are left out."""
    columns = list(PHASE_COLUMNS)
    labels = PHASE_COLUMNS
    if "pool" in summary.columns:  # an asynchronous run: each pool's phases side by side
        columns.insert(1, "pool")
        labels = {"pool": "GPU pool", **PHASE_COLUMNS}
    frame = _by_scheme(summary).select(columns)
    if frame.is_empty():
        notes = [no_phases_reason(analysis)]
        return humanize(PHASE_TABLE_TITLE, frame, labels=labels, notes=notes)
    notes = [SCHEME_NOTE if analysis.pools is None else SCHEME_NOTE.replace(POOL_FROM, POOL_TO)]
    if analysis.summary.gpu.n_gpu_ops == 0:
        notes.append("No GPU activity in these traces (a CPU-only capture): wall times only.")
        frame = frame.drop(GPU_COLUMNS)
    else:
        frame, more = _gpu_time_notes(frame, analysis)
        notes += more
    title = PHASE_TABLE_TITLE
    if frame["n_steps"].null_count() == frame.height:
        notes.append("No step ranges: each phase over the whole capture (one value, no spread).")
        frame = frame.drop("n_steps", *(c for c in frame.columns if c.endswith(("_p10", "_p90"))))
        title = "Phase summary (whole capture)"
    if frame["energy_j"].null_count() == frame.height:
        notes.append("No power samples: no energy or power columns.")
    return humanize(title, frame, labels=labels, notes=notes, drop_empty=True)


def report_tables(analysis: Analysis, sections: list[Section] | None = None) -> list[ReportTable]:
    """Every table of the report, in order: the phase table, then each section's."""
    tables = [phase_table(phase_summary(analysis), analysis)]
    tables += [humanize(title, frame) for title, frame in sections or []]
    seen: dict[str, int] = {}
    for table in tables:  # distinct CSV names even for sections of the same title
        seen[table.slug] = seen.get(table.slug, 0) + 1
        if seen[table.slug] > 1:
            table.title = f"{table.title} ({seen[table.slug]})"
    return tables


def launching_processes(analysis: Analysis) -> str:
    """How many processes launched GPU operations: distinct (trace, pid) of the GPU activity.

    Also says how many of them mark worker (projection) ranges; says so where the analysis
    holds no launching process (no GPU activity, or a folder without ``gpu_activity.parquet``).
    """
    if not analysis.summary.gpu.n_gpu_ops:
        return "none (no GPU activity in these traces)"
    names = analysis.gpu_activity.collect_schema().names()
    if "pid" not in names:
        return "unknown (no GPU activity table in this analysis to tell the launching process)"
    keys = [k for k in ("trace", "pid") if k in names]  # a folder's activity keeps only pid
    launchers = (
        analysis.gpu_activity.filter(pl.col("pid").is_not_null()).select(keys).unique().collect()
    )
    if launchers.is_empty():
        return "unknown (the GPU operations carry no launching process)"
    projection = analysis.phases.filter(pl.col("attribution") == PROJECTION)
    marking = projection.select(keys).unique().join(launchers, on=keys, how="semi").height
    return f"{launchers.height} ({marking} of them mark worker ranges: projection scheme)"


#: what each scheme counts, in a few words (the GPU time headline's labels)
SCHEME_MEANING: dict[str, str] = {
    WINDOW: "driver phases, every GPU's work inside them",
    PROJECTION: "ranges, the work their own thread launched",
}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.2f} ms"


def scheme_gpu_times(analysis: Analysis, attributed: str = "in phases") -> list[str]:
    """Per scheme with phases (window, then projection): attributed and unattributed GPU time.

    From the summary's totals (``attributed_gpu_ns``/``unattributed_gpu_ns`` and the
    ``projection_`` pair). A scheme with no phase rows comes last, said to have none: its
    totals count no row of the table (window's is the GPU time inside any range, with no
    driver); a run without phase rows gets one part saying so. ``attributed``: the word for
    the attributed part. One definition for the report's headline and the terminal's line.
    """
    if analysis.phases.is_empty():
        return ["none in phases (the run has no phase rows)"]
    gpu = analysis.summary.gpu
    present = set(analysis.phases["attribution"].unique().to_list())
    sides = {
        WINDOW: (gpu.attributed_gpu_ns, gpu.unattributed_gpu_ns),
        PROJECTION: (gpu.projection_attributed_gpu_ns, gpu.projection_unattributed_gpu_ns),
    }
    parts, absent = [], []
    for scheme, (inside, outside) in sides.items():
        meaning = SCHEME_MEANING[scheme]
        if scheme == WINDOW and analysis.pools is not None:
            meaning = "driver phases, the work of their own pool's GPUs inside them"
        label = f"{scheme} ({meaning})"
        if scheme not in present:
            absent.append(f"{label}: no phases in this run")
            continue
        share = f" ({100 * outside / gpu.total_gpu_ns:.1f} %)" if gpu.total_gpu_ns else ""
        parts.append(f"{label}: {_ms(inside)} {attributed}, {_ms(outside)} unattributed{share}")
    return parts + absent


def gpu_time_headline(analysis: Analysis) -> str:
    """The report's "GPU time" line: the total, then each scheme (:func:`scheme_gpu_times`)."""
    gpu = analysis.summary.gpu
    if not gpu.n_gpu_ops:
        return "none: no GPU activity in these traces (a CPU-only capture)"
    return f"{_ms(gpu.total_gpu_ns)}; " + "; ".join(scheme_gpu_times(analysis))


#: what stands for the step count of a run whose phases have no step
NO_STEPS = "no step ranges: whole capture"


def step_count(analysis: Analysis) -> int:
    """The run's steps: its step ranges, else the distinct steps its phases carry (payload)."""
    return analysis.summary.n_steps or analysis.phases["step"].drop_nulls().n_unique()


def steps_text(analysis: Analysis) -> str:
    """The run's step count, or :data:`NO_STEPS` where no phase has a step."""
    return str(step_count(analysis) or NO_STEPS)


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
            ", ".join(s.gpus)
            or (f"{s.n_devices} device(s), model not in the export" if s.n_devices else "none"),
        ),
        ("NVIDIA driver", ", ".join(s.driver_versions) or "not in the export"),
        ("processes launching GPU work", launching_processes(analysis)),
        ("steps", steps_text(analysis)),
        ("GPU operations", f"{gpu.n_gpu_ops:,}"),
        ("GPU time", gpu_time_headline(analysis)),
        (
            "energy",
            f"{energy.total_energy_j:,.3f} J: {energy.attributed_energy_j:,.3f} J in phases, "
            f"{energy.unattributed_energy_j:,.3f} J unattributed (source {energy.power_source}, "
            f"sampling every {(energy.power_interval_ns or 0) / 1e6:.2f} ms)"
            if energy is not None
            else "no power samples",
        ),
    ]


def _finding_text(f: Finding) -> str:
    return f"{f.topic}: not available — {f.text}." if f.omitted else f.text


@dataclass(frozen=True)
class _Content:
    """What both pages show, computed once: the tables and "what stands out"."""

    tables: list[ReportTable]
    findings: list[Finding]


def _content(analysis: Analysis, sections: list[Section] | None) -> _Content:
    findings = what_stands_out(analysis, phase_summary(analysis))
    return _Content(report_tables(analysis, sections), findings)


def _markdown(analysis: Analysis, figures: list[Path], out: Path, content: _Content) -> str:
    m = escape_md
    lines = ["# nvtx-phases report", ""]
    lines += [f"- **{m(k)}**: {m(v)}" for k, v in _metadata(analysis)]
    lines += ["", "## What stands out", ""]
    lines += [f"- {m(_finding_text(f))}" for f in content.findings]
    for table in content.tables:
        lines += md_table(table)
    lines += ["", "## Figures", ""]
    lines += md_figures(figures, out, caption_for)
    if analysis.warnings:
        lines += ["", "## Warnings", ""] + [f"- {m(w)}" for w in analysis.warnings]
    return "\n".join(lines) + "\n"


def _html(analysis: Analysis, figures: list[Path], content: _Content) -> str:
    e = escape_html
    meta = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _metadata(analysis))
    findings = "".join(
        f'<li class="omitted">{e(_finding_text(f))}</li>' if f.omitted else f"<li>{e(f.text)}</li>"
        for f in content.findings
    )
    tables = "".join(html_table(t) for t in content.tables)
    images = html_figures(figures, caption_for)
    warnings = "".join(f"<li>{e(w)}</li>" for w in analysis.warnings)
    body = (
        f'<table class="meta">{meta}</table>\n'
        f'<h2>What stands out</h2><ul class="stands-out">{findings}</ul>\n{tables}\n'
        f"<h2>Figures</h2>{images or '<p>no figures</p>'}\n"
        f'<h2>Warnings</h2><ul class="warnings">{warnings or "<li>none</li>"}</ul>'
    )
    return page("nvtx-phases report", body)


def to_markdown(
    analysis: Analysis, figures: list[Path], out: Path, sections: list[Section] | None = None
) -> str:
    """The report as Markdown (figures and table CSVs linked relative to ``out``)."""
    return _markdown(analysis, figures, out, _content(analysis, sections))


def to_html(analysis: Analysis, figures: list[Path], sections: list[Section] | None = None) -> str:
    """The report as one self-contained HTML page (figures embedded, tables linked as CSV)."""
    return _html(analysis, figures, _content(analysis, sections))


def write_tables(tables: list[ReportTable], out: Path) -> list[Path]:
    """Each table as CSV under ``out`` (``tables/<name>.csv``), atomically."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    return [atomic_write(out / csv_name(t), t.frame.write_csv) for t in tables]


def write_report(
    analysis: Analysis, out: str | Path, figures: list[Path], sections: list[Section] | None = None
) -> list[Path]:
    """Write ``report.html``, ``report.md`` and their tables as CSV under ``out``.

    ``sections``: extra tables, in the analysis' own columns (converted to display units).
    """
    out = Path(out)
    content = _content(analysis, sections)
    text_md = _markdown(analysis, figures, out, content)
    text_html = _html(analysis, figures, content)
    return [
        atomic_write(out / "report.html", lambda p: p.write_text(text_html, encoding="utf-8")),
        atomic_write(out / "report.md", lambda p: p.write_text(text_md, encoding="utf-8")),
        *write_tables(content.tables, out),
    ]
