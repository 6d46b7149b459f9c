"""Compare runs phase by phase: median and p10–p90 over steps, differences against the first run.

Runs of different step counts compare on their medians; steps present in every run are also
compared index by index (``compare_steps.csv``). Runs without step ranges (captures of code
that marks phases but no ``step``, or ``--all-ranges`` on a plain PyTorch capture) compare
each phase over the whole capture instead: one value per run, ``n_steps`` null. Runs that
cannot be compared (no phases, per-step against whole-capture, no phase in common with the
first run) raise :class:`~analysis.errors.AnalysisError` with the reason.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl

from analysis.aggregate.steps import METRICS, over_steps, step_phase_metrics
from analysis.errors import AnalysisError
from analysis.render.figures import save_figure
from analysis.render.files import atomic_write
from analysis.run.pipeline import Analysis

KEYS = ["path", "attribution"]
#: most phases drawn per comparison figure (the largest by the metric); all go to the tables
MAX_FIGURE_PHASES = 30


def _no_phases(label: str, analysis: Analysis) -> AnalysisError:
    n_ranges = analysis.summary.get("n_ranges") or 0
    why = (
        "the capture holds no NVTX ranges"
        if not n_ranges
        else f"none of its {n_ranges:,} NVTX ranges is a phase: pass --all-ranges, or "
        "--phase-map FILE.toml naming yours"
    )
    return AnalysisError(f"{label}: no phases to compare ({why})")


def run_metrics(label: str, analysis: Analysis) -> tuple[pl.DataFrame, bool]:
    """Per-step phase metrics of one run, and whether they cover the whole capture instead.

    A run with phases but no step index on any of them (no ``step`` range, no payload) gives
    one row per phase for the whole capture (``step`` 0) and ``True``.
    """
    phases = analysis.phases
    if phases.is_empty():
        raise _no_phases(label, analysis)
    if phases["step"].is_not_null().any():
        return step_phase_metrics(phases), False
    return step_phase_metrics(phases.with_columns(pl.lit(0, dtype=pl.Int64).alias("step"))), True


def _check_comparable(metrics: dict[str, pl.DataFrame], whole: dict[str, bool]) -> None:
    """Refuse mixtures of per-step and whole-capture runs, and runs sharing no phase."""
    if len(set(whole.values())) > 1:
        stepped = [label for label, w in whole.items() if not w]
        unstepped = [label for label, w in whole.items() if w]
        raise AnalysisError(
            f"cannot compare {', '.join(stepped)} (per step) with {', '.join(unstepped)} "
            "(no step ranges: whole capture only); compare runs of one kind"
        )
    labels = list(metrics)
    keys = {label: set(frame.select(KEYS).rows()) for label, frame in metrics.items()}
    base = labels[0]
    for label in labels[1:]:
        if not keys[label] & keys[base]:
            raise AnalysisError(
                f"runs share no phase: {label} has {len(keys[label]):,} phase path(s) (e.g. "
                f"'{min(keys[label])[0]}'), {base} {len(keys[base]):,} (e.g. "
                f"'{min(keys[base])[0]}'), none in common; nothing to compare"
            )


def compare_runs(runs: dict[str, Analysis]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary, per-step) comparison tables in long form, differences against the first run.

    summary: ``path, attribution, metric, run, n_steps, median, p10, p90, diff, ratio``;
    steps: ``step, path, attribution, metric, run, value, diff`` for steps every run has.
    Runs without step ranges are compared over the whole capture (``n_steps`` null, ``steps``
    empty). Raises :class:`AnalysisError` when the runs cannot be compared.
    """
    if len(runs) < 2:
        raise AnalysisError("compare needs at least two runs")
    labels = list(runs)
    base = labels[0]
    metrics, whole = {}, {}
    for label, analysis in runs.items():
        metrics[label], whole[label] = run_metrics(label, analysis)
    _check_comparable(metrics, whole)
    whole_capture = whole[base]
    summaries, per_steps = [], []
    for label, per_step in metrics.items():
        per_steps.append(per_step.with_columns(pl.lit(label).alias("run")))
        wide = over_steps(per_step)
        if whole_capture:
            wide = wide.with_columns(pl.lit(None, dtype=pl.Int64).alias("n_steps"))
        for metric in METRICS:
            summaries.append(
                wide.select(
                    *KEYS,
                    pl.lit(metric).alias("metric"),
                    pl.lit(label).alias("run"),
                    "n_steps",
                    pl.col(metric).alias("median"),
                    pl.col(f"{metric}_p10").alias("p10"),
                    pl.col(f"{metric}_p90").alias("p90"),
                )
            )
    order = {label: i for i, label in enumerate(labels)}  # the caller's order, first = reference
    summary = pl.concat(summaries).with_columns(
        pl.col("run").replace_strict(order).alias("run_order")
    )
    reference = summary.filter(pl.col("run") == base).select(
        *KEYS, "metric", pl.col("median").alias("_base")
    )
    summary = (
        summary.join(reference, on=[*KEYS, "metric"], how="left")
        .with_columns(
            (pl.col("median") - pl.col("_base")).alias("diff"),
            (pl.col("median") / pl.col("_base")).alias("ratio"),
        )
        .drop("_base")
        .sort(*KEYS, "metric", "run_order")
    )
    long = pl.concat(per_steps, how="diagonal_relaxed").unpivot(
        index=["step", *KEYS, "run"], on=list(METRICS), variable_name="metric", value_name="value"
    )
    common = (
        long.group_by("step")
        .agg(pl.col("run").n_unique())
        .filter(pl.col("run") == len(labels))["step"]
    )
    if whole_capture:  # step 0 stands for the whole capture: no per-step comparison
        common = common.clear()
    steps = long.filter(pl.col("step").is_in(common.implode()))
    step_ref = steps.filter(pl.col("run") == base).select(
        "step", *KEYS, "metric", pl.col("value").alias("_base")
    )
    steps = (
        steps.join(step_ref, on=["step", *KEYS, "metric"], how="left")
        .with_columns((pl.col("value") - pl.col("_base")).alias("diff"))
        .drop("_base")
        .with_columns(pl.col("run").replace_strict(order).alias("run_order"))
        .sort("step", *KEYS, "metric", "run_order")
    )
    return summary, steps


def comparison_figures(
    summary: pl.DataFrame, out: Path, *, max_phases: int = MAX_FIGURE_PHASES
) -> list[Path]:
    """One grouped-bar figure per metric (median, p10–p90 whiskers) over the step phases.

    At most ``max_phases`` phases per figure: those with the largest median in any run.
    """
    written: list[Path] = []
    data = summary.filter(
        (pl.col("attribution") == "window") | ~pl.col("path").str.starts_with("step")
    ).filter(pl.col("median").is_not_null())
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    for metric, (label, unit) in METRICS.items():
        rows = data.filter(pl.col("metric") == metric)
        if rows.is_empty():
            continue
        paths = rows["path"].unique(maintain_order=True).to_list()
        n_paths = len(paths)
        if n_paths > max_phases:  # --all-ranges on a PyTorch capture: thousands of ranges
            largest = set(
                rows.group_by("path")
                .agg(pl.col("median").max())
                .sort("median", "path", descending=[True, False])
                .head(max_phases)["path"]
                .to_list()
            )
            paths = [p for p in paths if p in largest]
            rows = rows.filter(pl.col("path").is_in(paths))
        width = 0.8 / len(runs)
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(paths) + 2), 4))
        for k, run in enumerate(runs):
            mine = {r["path"]: r for r in rows.filter(pl.col("run") == run).iter_rows(named=True)}
            medians = [mine[p]["median"] if p in mine else 0.0 for p in paths]
            low = [
                m - (mine[p]["p10"] if p in mine else m)
                for p, m in zip(paths, medians, strict=True)
            ]
            high = [
                (mine[p]["p90"] if p in mine else m) - m
                for p, m in zip(paths, medians, strict=True)
            ]
            xs = [i - 0.4 + width * (k + 0.5) for i in range(len(paths))]
            ax.bar(xs, medians, width, yerr=[low, high], capsize=2, label=run)
        ticks = [p if len(p) <= 40 else p[:39] + "…" for p in paths]  # long range names
        ax.set_xticks(range(len(paths)), ticks, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{label} ({unit}), median over steps")
        shown = f" ({len(paths)} largest of {n_paths})" if n_paths > len(paths) else ""
        ax.set_title(f"{label} per phase{shown}")
        ax.legend(frameon=False)
        fig.tight_layout()
        written += save_figure(fig, out, f"compare_{metric}")
    return written


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:,.3f}"


def to_markdown(
    summary: pl.DataFrame,
    metrics: tuple[str, ...] = ("wall_ms", "energy_j", "avg_power_w", "memcpy_mb", "nccl_ms"),
) -> str:
    """Side-by-side table per phase: each run's median (p10–p90) and the difference to the first."""
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
    if not runs:
        return ""
    base = runs[0]
    lines = []
    for metric in metrics:
        rows = summary.filter(pl.col("metric") == metric)
        if rows["median"].null_count() == rows.height:
            continue
        label, unit = METRICS[metric]
        lines += [f"### {label} ({unit})", ""]
        header = ["phase path", "attribution", *runs, *(f"{r} − {base}" for r in runs[1:])]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        # one pass over the rows (a dict per phase, in first-seen order): thousands of phases
        # (--all-ranges) stay fast
        phases: dict[tuple[str, str], dict[str, dict]] = {}
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
