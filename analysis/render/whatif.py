"""Write what-if bounds: ``whatif.csv`` (per step), ``whatif.md`` (over the run), a figure.

The tables come finished from :mod:`analysis.workload.whatif`; nothing here computes a bound.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analysis.render.files import atomic_write
from analysis.workload.whatif import ENERGY_RULE, WHOLE_STEP

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
    return "–" if value is None else f"{value:.1f}%"


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


def whatif_markdown(run: pl.DataFrame, source: str) -> str:
    """``whatif.md``: the run-level table, then every bound's assumption (or why it is missing)."""
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


def whatif_figure(table: pl.DataFrame, out: Path) -> list[Path]:
    """Measured step time and each step-level bound, per step (``whatif_per_step``)."""
    from matplotlib.ticker import MaxNLocator

    from analysis.render.figures import plt, save_figure  # matplotlib only when drawing

    steps = table.filter(
        pl.col("bound_s").is_not_null()
        & ((pl.col("bound") != "balanced_dp") | (pl.col("variant") == WHOLE_STEP))
    )
    if steps.is_empty():
        return []
    fig, ax = plt.subplots(figsize=(7, 4))
    measured = steps.group_by("step").agg(pl.col("measured_s").first()).sort("step")
    ax.plot(measured["step"], measured["measured_s"], "k-o", label="measured", linewidth=2)
    for (bound, variant), rows in steps.group_by("bound", "variant", maintain_order=True):
        rows = rows.sort("step")
        ax.plot(rows["step"], rows["bound_s"], marker=".", label=f"{bound} / {variant}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("step time (s)")
    ax.set_ylim(bottom=0)
    ax.set_title("What-if: step time under each bound")
    ax.legend(frameon=False, fontsize=7)
    fig.tight_layout()
    return save_figure(fig, out, "whatif_per_step")


def write_whatif(
    table: pl.DataFrame, run: pl.DataFrame, out: Path, *, source: str, figures: bool = True
) -> list[Path]:
    """Write ``whatif.csv``, ``whatif.md`` and (``figures``) the figure to ``out``; the paths."""
    text = whatif_markdown(run, source)
    written = [
        atomic_write(out / "whatif.csv", table.write_csv),
        atomic_write(out / "whatif.md", lambda p: p.write_text(text, encoding="utf-8")),
    ]
    if figures:
        written += whatif_figure(table, out / "figures")
    return written
