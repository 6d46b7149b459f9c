"""Figures from finished tables (matplotlib, headless, PNG and SVG). Nothing here computes metrics.

Every function takes frames an analysis already produced and returns the files it wrote; one
that lacks its data (no GPU work, no power samples) writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt
import polars as pl

from analysis.aggregate.step_stack import OTHER, step_phases, step_stack
from analysis.model import WINDOW, Analysis
from analysis.normalize.devices import device_label
from analysis.render.files import atomic_write
from nvtx_phases.naming import phase_color

# Same inputs, same bytes: fixed SVG ids and no creation date, so outputs can be diffed.
matplotlib.rcParams["svg.hashsalt"] = "nvtx-phases"


def _color(name: str) -> str:
    return f"#{phase_color(name) & 0xFFFFFF:06x}"


def _total(data: pl.DataFrame, *columns: str) -> float:
    """The sum of ``columns`` over every row (nulls ignored)."""
    return sum(cast(float, data[column].sum()) for column in columns)


def _phase_order(data: pl.DataFrame) -> list[str]:
    return (
        data.group_by("canonical")
        .agg(pl.col("start_ns").min())
        .sort("start_ns")["canonical"]
        .to_list()
    )


_METADATA: dict[str, dict[str, str | None]] = {"png": {}, "svg": {"Date": None}}


def save_figure(fig: plt.Figure, out: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``stem``.png and .svg under ``out`` (atomically) and close it."""

    def writer(ext: str) -> Callable[[Path], None]:
        return lambda p: fig.savefig(p, format=ext, dpi=150, metadata=_METADATA[ext])

    paths = [atomic_write(out / f"{stem}.{ext}", writer(ext)) for ext in ("png", "svg")]
    plt.close(fig)
    return paths


def phase_time_per_step(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars of each phase's wall time per step (binned means beyond ``MAX_STEP_BARS``).

    A fixed canvas whatever the number of steps; phases in execution order, then ``other``.
    """
    stack = step_stack(phases)
    if stack.is_empty():
        return []
    bars = stack.select("bar", "first_step").unique().sort("first_step")["bar"].to_list()
    binned = len(bars) < stack["first_step"].n_unique() or any("–" in b for b in bars)
    order = [n for n in _phase_order(step_phases(phases)) if n != OTHER]
    if OTHER in stack["canonical"].to_list():
        order.append(OTHER)
    fig, ax = plt.subplots(figsize=(8, 4))
    bottom = [0.0] * len(bars)
    for name in order:
        by_bar = dict(
            stack.filter(pl.col("canonical") == name).select("bar", "wall_ms").iter_rows()
        )
        heights = [by_bar.get(b, 0.0) for b in bars]
        ax.bar(
            range(len(bars)),
            heights,
            bottom=bottom,
            label=name,
            color="#d9d9d9" if name == OTHER else _color(name),
            edgecolor="white",
            linewidth=0.3 if len(bars) > 20 else 0.5,
        )
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ticks = list(range(0, len(bars), max(1, len(bars) // 10)))
    ax.set_xticks(ticks, [bars[i] for i in ticks], rotation=30 if binned else 0, fontsize=8)
    ax.set_xlabel("steps (mean per step in each bin)" if binned else "step")
    ax.set_ylabel("wall time (ms)")
    ax.set_title("Phase time per step")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "phase_time_per_step")


def busy_idle_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Bars: GPU busy vs idle time per phase, summed over steps and devices."""
    data = step_phases(phases)
    if data.is_empty() or _total(data, "gpu_busy_ns", "idle_ns") == 0:
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
    return save_figure(fig, out, "busy_idle_per_phase")


def phase_share(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase: median share of step time, and of step energy when measured."""
    data = step_phases(phases)
    if data.is_empty():
        return []
    shares = data.with_columns(
        (pl.col("wall_ns") / pl.col("wall_ns").sum().over("step") * 100).alias("time_pct"),
        (pl.col("energy_j") / pl.col("energy_j").sum().over("step") * 100).alias("energy_pct"),
    )
    median = (
        shares.group_by("canonical")
        .agg(
            pl.col("time_pct").median(),
            pl.col("energy_pct").median(),
            pl.col("start_ns").min(),
            pl.col("has_energy").any(),
        )
        .sort("start_ns")
    )
    names = median["canonical"].to_list()
    x = range(len(names))
    has_energy = bool(median["has_energy"].any())
    width = 0.4 if has_energy else 0.7
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(names) + 2), 4))
    ax.bar(
        [i - width / 2 if has_energy else i for i in x],
        median["time_pct"].to_list(),
        width,
        label="time",
        color="#4C72B0",
    )
    if has_energy:
        ax.bar(
            [i + width / 2 for i in x],
            median["energy_pct"].fill_null(0).to_list(),
            width,
            label="energy",
            color="#DD8452",
        )
    ax.set_xticks(list(x), names, rotation=30)
    ax.set_ylabel("share of step (%, median over steps)")
    ax.set_title("Where a step's time" + (" and energy" if has_energy else "") + " go")
    ax.legend(frameon=False)
    fig.tight_layout()
    return save_figure(fig, out, "phase_share")


def data_movement_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase: NCCL and memcpy time (bars) and bytes copied (line), summed over steps."""
    data = step_phases(phases)
    if data.is_empty() or _total(data, "nccl_ns", "memcpy_ns") == 0:
        return []
    per_phase = (
        data.group_by("canonical")
        .agg(
            pl.col("nccl_ns").sum(),
            pl.col("memcpy_ns").sum(),
            pl.col("memcpy_bytes").sum(),
            pl.col("start_ns").min(),
        )
        .sort("start_ns")
    )
    names = per_phase["canonical"].to_list()
    x = list(range(len(names)))
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(names) + 2), 4))
    ax.bar(
        [i - 0.2 for i in x],
        (per_phase["nccl_ns"] / 1e6).to_list(),
        0.4,
        label="NCCL kernels",
        color="#C44E52",
    )
    ax.bar(
        [i + 0.2 for i in x],
        (per_phase["memcpy_ns"] / 1e6).to_list(),
        0.4,
        label="memcpy",
        color="#8172B2",
    )
    ax.set_ylabel("time, all devices (ms)")
    ax.set_xticks(x, names, rotation=30)
    twin = ax.twinx()
    twin.plot(
        x, (per_phase["memcpy_bytes"] / 1e6).to_list(), "o-", color="#555555", label="memcpy MB"
    )
    twin.set_ylabel("memcpy (MB)")
    ax.set_title("Data movement per phase (all steps)")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [str(h.get_label()) for h in handles], frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "data_movement_per_phase")


def execution_order(phases: pl.DataFrame) -> list[str]:
    """Phase paths in order of their first start (the order the run executes them)."""
    return (
        phases.group_by("path")
        .agg(pl.col("start_ns").min())
        .sort("start_ns", "path")["path"]
        .to_list()
    )


def energy_per_phase_device(
    phase_devices: pl.DataFrame, out: Path, order: list[str] | None = None
) -> list[Path]:
    """Grouped bars: energy of each phase on each GPU, summed over steps.

    Phases in ``order`` (execution order, from :func:`execution_order`); others after, by name.
    """
    if "energy_j" not in phase_devices.columns:
        return []
    data = phase_devices.filter(
        pl.col("path").str.starts_with("step/")
        & (pl.col("path").str.count_matches("/") == 1)
        & pl.col("energy_j").is_not_null()
    )
    if data.is_empty():
        return []
    per = data.group_by("path", "device").agg(pl.col("energy_j").sum()).sort("path", "device")
    present = set(per["path"].to_list())
    ranked = [n for n in (order or []) if n in present]
    names: list[str] = ranked + sorted(present - set(ranked))
    devices = sorted(per["device"].unique().to_list())
    width = 0.8 / len(devices)
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(names) + 2), 4))
    for k, device in enumerate(devices):
        values = dict(per.filter(pl.col("device") == device).select("path", "energy_j").iter_rows())
        ax.bar(
            [i - 0.4 + width * (k + 0.5) for i in range(len(names))],
            [values.get(n, 0.0) for n in names],
            width,
            label=device_label(device),
        )
    ax.set_xticks(range(len(names)), [n.split("/", 1)[1] for n in names], rotation=30)
    ax.set_ylabel("energy (J, all steps)")
    ax.set_title("Energy per phase per GPU")
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "energy_per_phase_device")


def power_timeline(phases: pl.DataFrame, samples: pl.DataFrame | None, out: Path) -> list[Path]:
    """Power per GPU over time, with driver phases as bands and phase boundaries as markers."""
    if samples is None or samples.is_empty():
        return []
    bands = phases.filter(
        pl.col("path").str.starts_with("step/")
        & (pl.col("path").str.count_matches("/") == 1)
        & (pl.col("attribution") == WINDOW)
    ).select("canonical", "start_ns", "end_ns")
    devices = sorted(samples["device"].unique().to_list())
    fig, axes = plt.subplots(
        len(devices), 1, figsize=(10, 1.8 * len(devices) + 1), sharex=True, squeeze=False
    )
    seen: set[str] = set()
    for ax, device in zip(axes[:, 0], devices, strict=True):
        for name, start, end in bands.iter_rows():
            ax.axvspan(
                start / 1e6,
                end / 1e6,
                color=_color(name),
                alpha=0.18,
                lw=0,
                label=None if name in seen else name,
            )
            ax.axvline(start / 1e6, color="#999999", lw=0.4)
            seen.add(name)
        series = samples.filter(pl.col("device") == device).sort("t_ns")
        ax.plot(
            (series["t_ns"] / 1e6).to_list(), series["power_w"].to_list(), color="#222222", lw=0.8
        )
        ax.set_ylabel(f"{device_label(device)}\nW", fontsize=8)
    axes[-1, 0].set_xlabel("time (ms, run clock)")
    axes[0, 0].set_title("GPU power with phases")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.08 if handles else 0, 1, 1))
    if handles:
        fig.legend(
            handles, labels, loc="lower center", fontsize=7, frameon=False, ncol=min(8, len(labels))
        )
    return save_figure(fig, out, "power_timeline")


def write_figures(analysis: Analysis, out: str | Path) -> list[Path]:
    """Every figure the analysis has data for, PNG and SVG, under ``out``."""
    out = Path(out)
    phases = analysis.phases
    return [
        *phase_time_per_step(phases, out),
        *phase_share(phases, out),
        *busy_idle_per_phase(phases, out),
        *data_movement_per_phase(phases, out),
        *energy_per_phase_device(analysis.phase_devices, out, execution_order(phases)),
        *power_timeline(phases, analysis.power_samples, out),
    ]
