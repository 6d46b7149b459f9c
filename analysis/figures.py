"""Figures from finished phase tables (matplotlib, headless). Nothing here computes metrics."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt
import polars as pl

from analysis.output import atomic_write
from nvtx_phases.naming import phase_color


def step_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """The phases directly inside ``step`` (summed over processes), else top-level ranges."""
    inside = phases.filter(
        pl.col("path").str.starts_with("step/") & (pl.col("path").str.count_matches("/") == 1)
    )
    if inside.is_empty():
        inside = phases.filter((pl.col("level") == 0) & (pl.col("canonical") != "step"))
    return (
        inside.filter(pl.col("step").is_not_null())
        .group_by("step", "canonical")
        .agg(
            pl.col("wall_ns").sum(),
            pl.col("gpu_busy_ns").sum(),
            pl.col("idle_ns").sum(),
            pl.col("start_ns").min(),
        )
        .sort("step", "start_ns")
    )


def _save(fig: plt.Figure, out: Path, stem: str) -> list[Path]:
    paths = []
    for ext in ("png", "svg"):
        paths.append(
            atomic_write(out / f"{stem}.{ext}", lambda p, e=ext: fig.savefig(p, format=e, dpi=150))
        )
    plt.close(fig)
    return paths


def phase_time_per_step(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars: wall time of each phase, one bar per step."""
    data = step_phases(phases)
    if data.is_empty():
        return []
    order = (
        data.group_by("canonical")
        .agg(pl.col("start_ns").min())
        .sort("start_ns")["canonical"]
        .to_list()
    )
    steps = sorted(data["step"].unique().to_list())
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(steps) + 3), 4))
    bottom = [0.0] * len(steps)
    for name in order:
        by_step = dict(
            data.filter(pl.col("canonical") == name).select("step", "wall_ns").iter_rows()
        )
        heights = [by_step.get(s, 0) / 1e6 for s in steps]
        color = f"#{phase_color(name) & 0xFFFFFF:06x}"
        ax.bar(
            [str(s) for s in steps],
            heights,
            bottom=bottom,
            label=name,
            color=color,
            edgecolor="white",
            linewidth=0.5,
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("step")
    ax.set_ylabel("wall time (ms)")
    ax.set_title("Phase time per step")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8)
    fig.tight_layout()
    return _save(fig, out, "phase_time_per_step")


def busy_idle_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Bars: GPU busy vs idle time per phase, summed over steps and devices."""
    data = step_phases(phases)
    if data.is_empty() or data["gpu_busy_ns"].sum() + data["idle_ns"].sum() == 0:
        return []
    per_phase = (
        data.group_by("canonical")
        .agg(pl.col("gpu_busy_ns").sum(), pl.col("idle_ns").sum(), pl.col("start_ns").min())
        .sort("start_ns")
    )
    names = per_phase["canonical"].to_list()
    busy = (per_phase["gpu_busy_ns"] / 1e6).to_list()
    idle = (per_phase["idle_ns"] / 1e6).to_list()
    fig, ax = plt.subplots(figsize=(max(5, 0.8 * len(names) + 2), 4))
    ax.bar(names, busy, label="GPU busy", color="#4C72B0")
    ax.bar(names, idle, bottom=busy, label="GPU idle", color="#DDDDDD")
    ax.set_ylabel("GPU time, all devices (ms)")
    ax.set_title("GPU busy vs idle per phase (all steps)")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(frameon=False)
    fig.tight_layout()
    return _save(fig, out, "busy_idle_per_phase")


def write_figures(phases: pl.DataFrame, out: str | Path) -> list[Path]:
    """All figures of the core analysis, PNG and SVG, under ``out``."""
    out = Path(out)
    return [*phase_time_per_step(phases, out), *busy_idle_per_phase(phases, out)]
