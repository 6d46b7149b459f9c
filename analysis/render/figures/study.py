"""Figures of a study (:func:`analysis.workload.study.tidy_table`): one per question.

Each returns the files written, or a sentence saying why it was not drawn (an axis with one
value, no power samples, no ``n_gpus``), which the report and the terminal print instead.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from ...workload.study_views import (
    energy_per_sample,
    parallel_efficiency,
    phase_shares,
)
from ...workload.study_views import (
    token_energy as token_energy_rows,
)
from .compare import RUN_COLORS
from .phases import plt, save_figure

#: the step's direct phases' colours, in order of first appearance
FIGSIZE = (8.0, 4.5)
#: the reward phase's name
REWARD_PHASE = "step/reward"
#: metrics of the reward-cost figure: (metric, axis label)
REWARD_METRICS = (
    ("wall_ms", "time (ms)"),
    ("energy_j", "energy (J)"),
    ("memcpy_mb", "data moved (MB)"),
    ("avg_power_w", "power, all GPUs (W)"),
)


def _window(tidy: pl.DataFrame) -> pl.DataFrame:
    """The window scheme (driver phases) where a run has it, else its projection rows."""
    if (tidy["attribution"] == "window").any():
        return tidy.filter(pl.col("attribution") == "window")
    return tidy


def phase_signature(tidy: pl.DataFrame, out: Path, axis: str = "policy") -> list[Path] | str:
    """Stacked share of step time and of step energy per phase, one bar per run, by ``axis``."""
    rows = _window(tidy)
    panels = []
    for name in ("time", "energy"):
        shares = phase_shares(rows, name).filter(pl.col("share_pct").is_not_null())
        if not shares.is_empty():
            panels.append((name, shares))
    if not panels:
        return "no step phases with a step time"
    order = rows.select("run", axis).unique(maintain_order=True) if axis in rows.columns else None
    runs = (
        order.sort(axis, nulls_last=True, maintain_order=True)["run"].to_list()
        if order is not None
        else rows["run"].unique(maintain_order=True).to_list()
    )
    phases = (
        rows.filter(pl.col("path").str.count_matches("/") == 1)["path"]
        .unique(maintain_order=True)
        .to_list()
    )
    fig, axes = plt.subplots(1, len(panels), figsize=FIGSIZE, squeeze=False)
    data = []
    for ax, (name, shares) in zip(axes[0], panels, strict=True):
        bottom = [0.0] * len(runs)
        for i, phase in enumerate(phases):
            lookup = dict(shares.filter(pl.col("path") == phase).select("run", "share_pct").rows())
            heights = [lookup.get(r) or 0.0 for r in runs]  # a run without it: no bar
            ax.bar(
                runs,
                heights,
                bottom=bottom,
                label=phase.removeprefix("step/"),
                color=RUN_COLORS[i % len(RUN_COLORS)] if i < len(RUN_COLORS) else None,
            )
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        for run in runs:
            if run not in set(shares["run"]):
                ax.text(run, 2, "n/a", ha="center", va="bottom", fontsize=7, color="#777")
        ax.set_title(f"share of step {name} (%)")
        ax.set_ylim(0, max(100.0, max(bottom)) * 1.05)
        ax.tick_params(axis="x", rotation=30)
        data.append(shares.with_columns(pl.lit(name).alias("quantity")))
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if axis in rows.columns:
        fig.suptitle(f"Phase signature per run, grouped by {axis}")
    fig.tight_layout()
    return save_figure(fig, out, "study_phase_signature", data=pl.concat(data))


def reward_cost(tidy: pl.DataFrame, out: Path, axis: str = "reward") -> list[Path] | str:
    """The reward phase's time, energy, data movement and GPU power, one bar per run by ``axis``."""
    if axis not in tidy.columns or tidy[axis].drop_nulls().n_unique() < 2:
        return f"the {axis} axis has fewer than two values: no reward-paradigm comparison"
    rows = _window(tidy).filter(pl.col("path") == REWARD_PHASE)
    if rows.is_empty():
        return f"no '{REWARD_PHASE}' phase shared by the runs"
    rows = rows.sort(axis, "run", nulls_last=True)
    shown = [
        (m, t)
        for m, t in REWARD_METRICS
        if rows.filter(pl.col("metric") == m)["value"].is_not_null().any()
    ]
    fig, axes = plt.subplots(1, len(shown), figsize=FIGSIZE, squeeze=False)
    paradigms = rows[axis].unique(maintain_order=True).to_list()
    colour = {p: RUN_COLORS[i % len(RUN_COLORS)] for i, p in enumerate(paradigms)}
    for ax, (metric, title) in zip(axes[0], shown, strict=True):
        m = rows.filter(pl.col("metric") == metric)
        known = m.filter(pl.col("value").is_not_null())  # no power samples: no bar, "n/a"
        ax.bar(m["run"].to_list(), [0.0] * m.height, color="none")  # every run's slot
        ax.bar(
            known["run"].to_list(),
            known["value"].to_list(),
            color=[colour[p] for p in known[axis].to_list()],
        )
        for run in m.filter(pl.col("value").is_null())["run"]:
            ax.text(run, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#777")
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", rotation=45, labelsize=7)
    names = ", ".join("—" if p is None else str(p) for p in paradigms)
    fig.suptitle(f"Reward phase cost by {axis} (colours: {names})")
    fig.tight_layout()
    data = rows.filter(pl.col("metric").is_in([m for m, _ in shown])).select(
        "run", axis, "metric", "unit", "value"
    )
    return save_figure(fig, out, "study_reward_cost", data=data)


def scaling(tidy: pl.DataFrame, out: Path, group: str = "hardware") -> list[Path] | str:
    """Step time, energy per sample and parallel efficiency per phase against ``n_gpus``.

    One line per ``group`` value; samples per step from the tidy table (see
    :func:`~analysis.workload.study_views.parallel_efficiency`).
    """
    if "n_gpus" not in tidy.columns or tidy["n_gpus"].drop_nulls().n_unique() < 2:
        return "the n_gpus axis has fewer than two values: no scaling figure"
    eff = parallel_efficiency(_window(tidy), group)
    if eff.is_empty():
        return "no run has an n_gpus value"
    energy = energy_per_sample(_window(tidy), group)
    keys = [group] if group in eff.columns else []
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(11.0, 4.5))
    step = eff.filter(pl.col("path") == "step")
    for ax, frame, column in ((left, step, "wall_ms"), (middle, energy, "energy_per_sample_j")):
        if frame.is_empty():
            ax.text(0.5, 0.5, "n/a (no power or no sample counts)", ha="center", fontsize=8)
            continue
        for i, ((g,), part) in enumerate(
            frame.group_by(keys or [pl.lit("all")], maintain_order=True)
        ):
            ax.plot(
                part["n_gpus"],
                part[column],
                marker="o",
                label=str(g),
                color=RUN_COLORS[i % len(RUN_COLORS)],
            )
        ax.set_xlabel("GPUs")
        ax.legend(fontsize=7, title=group if keys else None)
    left.set_ylabel("median step time (ms)")
    middle.set_ylabel("step energy per sample (J), median over steps")
    phases = eff.filter(pl.col("path").str.count_matches("/") == 1)
    for i, (names, part) in enumerate(phases.group_by([*keys, "path"], maintain_order=True)):
        label = " · ".join(str(n).removeprefix("step/") for n in names)
        right.plot(
            part["n_gpus"],
            part["efficiency"],
            marker="o",
            label=label,
            color=RUN_COLORS[i % len(RUN_COLORS)],
            ls="-" if i < len(RUN_COLORS) else ":",
        )
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    right.set_xlabel("GPUs")
    per_sample = bool((eff["basis"] == "per_sample").all())
    right.set_ylabel(
        "parallel efficiency: GPU time per sample, base / n"
        if per_sample
        else "parallel efficiency T(base)·n_base / (T(n)·n), fixed batch assumed",
        fontsize=8,
    )
    right.legend(fontsize=7)
    fig.suptitle("Scaling with GPU count (median over runs of a point)")
    fig.tight_layout()
    data = pl.concat(
        [
            eff.with_columns(pl.lit("time_and_efficiency").alias("panel")),
            energy.with_columns(pl.lit("energy_per_sample").alias("panel")),
        ],
        how="diagonal_relaxed",
    )
    return save_figure(fig, out, "study_scaling", data=data)


def token_energy(tidy: pl.DataFrame, out: Path) -> list[Path] | str:
    """Energy per token (mJ) of the step and each direct phase, one bar per run in each group."""
    rows = token_energy_rows(_window(tidy))
    if rows.is_empty():
        return "no run has token counts with power (length records or verl_log, and power samples)"
    paths = rows["path"].unique(maintain_order=True).to_list()
    paths = [p for p in paths if p != "step"] + (["step"] if "step" in paths else [])
    runs = rows["run"].unique(maintain_order=True).to_list()
    fig, ax = plt.subplots(figsize=FIGSIZE)
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        lookup = dict(rows.filter(pl.col("run") == run).select("path", "mj_per_token").rows())
        xs = [k + (i - (len(runs) - 1) / 2) * width for k, p in enumerate(paths) if p in lookup]
        ax.bar(
            xs,
            [lookup[p] for p in paths if p in lookup],
            width=width,
            label=run,
            color=RUN_COLORS[i % len(RUN_COLORS)],
        )
    ax.set_xticks(range(len(paths)), [p.removeprefix("step/") for p in paths], rotation=30)
    ax.set_yscale("log")
    ax.set_ylabel("energy per token (mJ), over all steps")
    ax.legend(fontsize=7)
    fig.suptitle("Energy per token per phase (gen: response tokens; others: prompt + response)")
    fig.tight_layout()
    return save_figure(fig, out, "study_token_energy", data=rows)


def lengths(
    responses: dict[str, pl.DataFrame], summary: pl.DataFrame, task_of: dict[str, str], out: Path
) -> list[Path] | str:
    """Response-length CDF per task (left) and each run's max/mean and rank imbalance (right)."""
    if not responses:
        return "no run has response-length records (lengths = … or a NAME_lengths folder)"
    fig, (left, right) = plt.subplots(1, 2, figsize=FIGSIZE)
    tasks: dict[str, list[pl.DataFrame]] = {}
    for label, frame in responses.items():
        tasks.setdefault(task_of.get(label, label), []).append(
            frame.filter(~pl.col("validate")).select("output_len")
        )
    cdfs = []
    for i, (task, frames) in enumerate(tasks.items()):
        lens = pl.concat(frames)["output_len"].sort()
        n = lens.len()
        cdf = pl.DataFrame(
            {"task": [task] * n, "output_len": lens, "cdf": [(k + 1) / n for k in range(n)]}
        )
        left.step(
            cdf["output_len"],
            cdf["cdf"],
            where="post",
            label=task,
            color=RUN_COLORS[i % len(RUN_COLORS)],
        )
        cdfs.append(cdf)
    left.set_xlabel("response length (tokens)")
    left.set_ylabel("fraction of responses ≤ length")
    left.legend(fontsize=7, title="task")
    x = range(summary.height)
    for shift, column, text, colour in (
        (-0.2, "max_over_mean", "max/mean length", RUN_COLORS[0]),
        (0.2, "rank_imbalance", "DP-rank tokens max/mean", RUN_COLORS[1]),
    ):
        values = summary[column].to_list()
        known = [(i + shift, v) for i, v in zip(x, values, strict=True) if v is not None]
        right.bar([k for k, _ in known], [v for _, v in known], width=0.4, label=text, color=colour)
    right.set_xticks(list(x), summary["run"].to_list(), rotation=30, fontsize=7)
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    tallest = max(
        (v for c in ("max_over_mean", "rank_imbalance") for v in summary[c].drop_nulls()),
        default=1.0,
    )
    right.set_ylim(0, tallest * 1.3)  # room above the bars for the legend
    right.legend(fontsize=7, loc="upper right")
    right.set_title("median over steps", fontsize=9)
    fig.suptitle("Task → response-length structure")
    fig.tight_layout()
    data = pl.concat(
        [
            pl.concat(cdfs).with_columns(pl.lit("cdf").alias("panel")),
            summary.with_columns(pl.lit("imbalance").alias("panel")),
        ],
        how="diagonal_relaxed",
    )
    return save_figure(fig, out, "study_lengths", data=data)
