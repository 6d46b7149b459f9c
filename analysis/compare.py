"""Compare runs phase by phase: median and p10–p90 over steps, differences against the first run.

Runs of different step counts compare on their medians; steps present in every run are also
compared index by index (``compare_steps.csv``).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import polars as pl

from analysis.figures import save_figure
from analysis.output import atomic_write
from analysis.pipeline import Analysis
from analysis.summaries import METRICS, over_steps, step_phase_metrics

KEYS = ["path", "attribution"]


def compare_runs(runs: dict[str, Analysis]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(summary, per-step) comparison tables in long form, differences against the first run.

    summary: ``path, attribution, metric, run, n_steps, median, p10, p90, diff, ratio``;
    steps: ``step, path, attribution, metric, run, value, diff`` for steps every run has.
    """
    labels = list(runs)
    base = labels[0]
    summaries, per_steps = [], []
    for label, analysis in runs.items():
        per_step = step_phase_metrics(analysis.phases)
        per_steps.append(per_step.with_columns(pl.lit(label).alias("run")))
        wide = over_steps(per_step)
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


def comparison_figures(summary: pl.DataFrame, out: Path) -> list[Path]:
    """One grouped-bar figure per metric (median, p10–p90 whiskers) over the step phases."""
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
        ax.set_xticks(range(len(paths)), paths, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(f"{label} ({unit}), median over steps")
        ax.set_title(f"{label} per phase")
        ax.legend(frameon=False)
        fig.tight_layout()
        written += save_figure(fig, out, f"compare_{metric}")
    return written


def to_markdown(
    summary: pl.DataFrame,
    metrics: tuple[str, ...] = ("wall_ms", "energy_j", "avg_power_w", "memcpy_mb", "nccl_ms"),
) -> str:
    """Side-by-side table per phase: each run's median (p10–p90) and the difference to the first."""
    runs = summary.sort("run_order")["run"].unique(maintain_order=True).to_list()
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
        for (path, attribution), group in rows.group_by(KEYS, maintain_order=True):
            cells = {r["run"]: r for r in group.iter_rows(named=True)}

            def fmt(value: float | None) -> str:
                return "" if value is None else f"{value:,.3f}"

            values = [
                f"{fmt(cells[r]['median'])} ({fmt(cells[r]['p10'])}–{fmt(cells[r]['p90'])})"
                if r in cells
                else ""
                for r in runs
            ]
            diffs = [fmt(cells[r]["diff"]) if r in cells else "" for r in runs[1:]]
            name = str(path).replace("|", "\\|")
            lines.append("| " + " | ".join([name, attribution, *values, *diffs]) + " |")
        lines.append("")
    return "\n".join(lines)


def write_comparison(runs: dict[str, Analysis], out: str | Path) -> list[Path]:
    """compare.csv, compare_steps.csv, compare.md and one figure per metric under ``out``."""
    out = Path(out)
    summary, steps = compare_runs(runs)
    text = (
        "# nvtx-phases comparison\n\nRuns: "
        + ", ".join(runs)
        + f" (differences against {next(iter(runs))})\n\n"
        + to_markdown(summary)
    )
    return [
        atomic_write(out / "compare.csv", summary.write_csv),
        atomic_write(out / "compare_steps.csv", steps.write_csv),
        atomic_write(out / "compare.md", lambda p: p.write_text(text, encoding="utf-8")),
        *comparison_figures(summary, out / "figures"),
    ]
