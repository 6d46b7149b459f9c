"""Figures from finished tables (matplotlib, headless, PNG and SVG). Nothing here computes metrics.

Every function takes frames an analysis already produced and returns the files it wrote; one
that lacks its data (no GPU work, no power samples) writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt
import polars as pl
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch

from analysis.aggregate.step_stack import OTHER, step_phases, step_stack
from analysis.normalize.devices import device_label
from analysis.render.files import atomic_write
from nvtx_phases.naming import phase_color

# Same inputs, same bytes: fixed SVG ids and no creation date, so outputs can be diffed.
matplotlib.rcParams["svg.hashsalt"] = "nvtx-phases"


def phase_hex(name: str) -> str:
    """The phase's NVTX colour as ``#rrggbb`` (the one colour a phase has in every figure)."""
    return f"#{phase_color(name) & 0xFFFFFF:06x}"


def _total(data: pl.DataFrame, *columns: str) -> float:
    """The sum of ``columns`` over every row (nulls ignored)."""
    return sum(cast(float, data[column].sum()) for column in columns)


#: savefig's options per format: no SVG date (same inputs, same bytes); PNG at zlib level 1,
#: since level 6 spent a sixth of all drawing time compressing for files about a third smaller
_SAVE_OPTIONS: dict[str, dict[str, Any]] = {
    "png": {"pil_kwargs": {"compress_level": 1}},
    "svg": {"metadata": {"Date": None}},
}
DPI = 200
#: Every phase figure's canvas (inches), whatever the number of steps, phases and GPUs.
CANVAS = (8.0, 4.0)
#: Beyond this many GPUs, ``energy_per_phase_device`` draws the median over GPUs, not one bar each.
MAX_GPU_BARS = 8
#: Hatches telling up to ``MAX_GPU_BARS`` GPUs (or nodes) apart where colour is the phase's.
#: Mostly line hatches: dense dot and circle hatches make SVGs of megabytes.
HATCHES = ("", "////", "\\\\\\\\", "xx", "---", "|||", "++", "..")
_TIME_UNITS = ((3600e9, "h"), (1e9, "s"), (1e6, "ms"))
_BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B"))
_ENERGY_UNITS = ((1e6, "MJ"), (1e3, "kJ"), (1.0, "J"))
_QS = (0.1, 0.5, 0.9)  # p10, median, p90


def save_figure(
    fig: plt.Figure, out: Path, stem: str, data: pl.DataFrame | None = None
) -> list[Path]:
    """Write ``fig`` as ``stem``.png (at :data:`DPI`) and .svg under ``out`` (atomically); close it.

    ``data``: exactly the numbers the figure draws (bars, lines, whiskers, bins), written beside
    it as ``stem``.csv so a paper can re-plot them and a test can check them.
    """

    def writer(ext: str) -> Callable[[Path], None]:
        return lambda p: fig.savefig(p, format=ext, dpi=DPI, **_SAVE_OPTIONS[ext])

    paths = [atomic_write(out / f"{stem}.{ext}", writer(ext)) for ext in ("png", "svg")]
    plt.close(fig)
    if data is not None:
        paths.append(atomic_write(out / f"{stem}.csv", data.write_csv))
    return paths


def _unit(largest: float, units: tuple[tuple[float, str], ...]) -> tuple[float, str]:
    """The largest unit ``(factor, name)`` in which ``largest`` is at least 1 (else the smallest)."""
    return next(((f, u) for f, u in units if largest >= f), units[-1])


def _max(*series: pl.Series) -> float:
    """The largest value in ``series`` (0 when all are empty or null)."""
    return max(float(cast(float, s.max() or 0.0)) for s in series)


def _light(colors: list[str]) -> dict[str, Any]:
    """Bar style of a phase's secondary quantity (idle, energy, memcpy): light, hatched fill."""
    faces = [to_rgba(c, 0.3) for c in colors]
    return {"color": faces, "edgecolor": colors, "hatch": "////", "linewidth": 0.6}


def _key(label: str, light: bool = False, hatch: str = "") -> Patch:
    """A legend entry for a bar style, in grey (the bars take each phase's colour)."""
    if light:
        return Patch(label=label, facecolor="#66666650", edgecolor="#666666", hatch="////")
    return Patch(label=label, facecolor="#999999", hatch=hatch, edgecolor="white", linewidth=0.3)


def _whisker(ax: Axes, x: Sequence[float], low_mid_high: list[list[float]], label: str) -> Any:
    """A p10–p90 whisker around each median (an errorbar: no line joins the phases)."""
    low, mid, high = low_mid_high
    spread = [[m - v for m, v in zip(mid, low, strict=True)]]
    spread.append([v - m for m, v in zip(mid, high, strict=True)])
    style: dict[str, Any] = {"fmt": "none", "ecolor": "#333333", "elinewidth": 0.8, "capsize": 2}
    return ax.errorbar(x, mid, spread, label=label, **style)


def _phase_axis(ax: Axes, names: list[str]) -> None:
    """Phases on x in the given (execution) order; ticks slanted, long names cut in the middle."""
    short = [n if len(n) <= 22 else f"{n[:10]}…{n[-11:]}" for n in names]
    ax.set_xticks(range(len(names)), short, rotation=30, ha="right", rotation_mode="anchor")
    ax.tick_params(axis="x", labelsize=8 if len(names) <= 10 else 6)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_xlabel("phase (in execution order)")


def _finish(
    fig: plt.Figure, ax: Axes, keys: list[Any], out: Path, stem: str, title: str = "colour: phase"
) -> list[Path]:
    """Legend outside the data, right of the axes (as ``phase_time_per_step``); lay out; save."""
    style: dict[str, Any] = {"loc": "upper left", "frameon": False, "alignment": "left"}
    ax.legend(
        handles=keys, bbox_to_anchor=(1.01, 1.0), title=title, fontsize=8, title_fontsize=8, **style
    )
    fig.tight_layout()
    return save_figure(fig, out, stem)


def _per_phase(data: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``columns`` summed over steps per phase, phases in execution order."""
    sums = (pl.col(c).sum() for c in columns)
    return data.group_by("canonical").agg(*sums, pl.col("start_ns").min()).sort("start_ns")


def phase_time_per_step(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars of each phase's wall time per step (binned means beyond ``MAX_STEP_BARS``).

    A fixed canvas whatever the number of steps; phases in execution order, then ``other``.
    """
    stack = step_stack(phases)
    if stack.is_empty():
        return []
    bars = stack.select("bar", "first_step").unique().sort("first_step")["bar"].to_list()
    binned = len(bars) < stack["first_step"].n_unique() or any("–" in b for b in bars)
    order = [n for n in _per_phase(step_phases(phases))["canonical"] if n != OTHER]
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
            color="#d9d9d9" if name == OTHER else phase_hex(name),
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
    """Stacked bars per phase: GPU busy (phase colour) and idle (light, hatched), all steps and GPUs.

    A fixed canvas whatever the number of steps, phases and GPUs; phases in execution order.
    """
    data = step_phases(phases)
    if data.is_empty() or _total(data, "gpu_busy_ns", "idle_ns") == 0:
        return []
    per_phase = _per_phase(data, "gpu_busy_ns", "idle_ns")
    names = per_phase["canonical"].to_list()
    colors = [phase_hex(n) for n in names]
    factor, unit = _unit(_max(per_phase["gpu_busy_ns"] + per_phase["idle_ns"]), _TIME_UNITS)
    busy = (per_phase["gpu_busy_ns"] / factor).to_list()
    x = list(range(len(names)))
    fig, ax = plt.subplots(figsize=CANVAS)
    ax.bar(x, busy, 0.7, color=colors, edgecolor="white", linewidth=0.3)
    ax.bar(x, (per_phase["idle_ns"] / factor).to_list(), 0.7, bottom=busy, **_light(colors))
    _phase_axis(ax, names)
    ax.set_ylabel(f"GPU time, all GPUs and steps ({unit})")
    ax.set_title("GPU busy vs idle per phase")
    keys = [_key("GPU busy"), _key("GPU idle", light=True)]
    return _finish(fig, ax, keys, out, "busy_idle_per_phase")


def phase_share(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase: median share of step time, and of step energy when measured (light, hatched).

    Whiskers: p10–p90 over steps. Fixed canvas; phases in execution order, in their colours.
    """
    data = step_phases(phases)
    if data.is_empty():
        return []
    shares = data.with_columns(
        (pl.col("wall_ns") / pl.col("wall_ns").sum().over("step") * 100).alias("time"),
        (pl.col("energy_j") / pl.col("energy_j").sum().over("step") * 100).alias("energy"),
    )
    stats = (
        shares.group_by("canonical")
        .agg(
            *(
                pl.col(c).quantile(q, "linear").alias(f"{c}{q}")
                for c in ("time", "energy")
                for q in _QS
            ),
            pl.col("start_ns").min(),
            pl.col("has_energy").any(),
        )
        .sort("start_ns")
        .fill_null(0.0)
    )
    names = stats["canonical"].to_list()
    colors = [phase_hex(n) for n in names]
    has_energy = bool(stats["has_energy"].any())
    n_steps = data["step"].n_unique()
    width = 0.4 if has_energy else 0.7
    fig, ax = plt.subplots(figsize=CANVAS)
    keys: list[Any] = [_key("time share")]
    bars = [("time", -width / 2 if has_energy else 0.0, {"color": colors, "edgecolor": "white"})]
    if has_energy:
        keys.append(_key("energy share", light=True))
        bars.append(("energy", width / 2, _light(colors)))
    for quantity, shift, style in bars:
        x = [i + shift for i in range(len(names))]
        qs = [stats[f"{quantity}{q}"].to_list() for q in _QS]
        ax.bar(x, qs[1], width, **style)  # type: ignore[arg-type]
        whisker = _whisker(ax, x, qs, "p10–p90 over steps") if n_steps > 1 else None
    _phase_axis(ax, names)
    ax.set_ylabel("share of step (%)")
    what = "time and energy" if has_energy else "time"
    ax.set_title(f"Share of a step's {what} per phase (median over {n_steps} steps)")
    return _finish(fig, ax, [*keys, *([whisker] if whisker else [])], out, "phase_share")


def data_movement_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase, summed over steps and GPUs: NCCL and memcpy time (top), memcpy bytes (bottom).

    Bars only (phases are categories: no line joins them); fixed canvas; execution order.
    """
    data = step_phases(phases)
    if data.is_empty() or _total(data, "nccl_ns", "memcpy_ns") == 0:
        return []
    per_phase = _per_phase(data, "nccl_ns", "memcpy_ns", "memcpy_bytes")
    names = per_phase["canonical"].to_list()
    colors = [phase_hex(n) for n in names]
    x = list(range(len(names)))
    tf, time_unit = _unit(_max(per_phase["nccl_ns"], per_phase["memcpy_ns"]), _TIME_UNITS)
    bf, byte_unit = _unit(_max(per_phase["memcpy_bytes"]), _BYTE_UNITS)
    fig, (top, low) = plt.subplots(2, 1, figsize=CANVAS, sharex=True, height_ratios=(3, 2))
    nccl = (per_phase["nccl_ns"] / tf).to_list()
    top.bar([i - 0.2 for i in x], nccl, 0.4, color=colors, edgecolor="white", linewidth=0.3)
    memcpy = (per_phase["memcpy_ns"] / tf).to_list()
    top.bar([i + 0.2 for i in x], memcpy, 0.4, **_light(colors))
    top.set_ylabel(f"time, all GPUs\nand steps ({time_unit})")
    top.set_title("Data movement per phase")
    low.bar(x, (per_phase["memcpy_bytes"] / bf).to_list(), 0.4, **_light(colors))
    low.set_ylabel(f"memcpy bytes\n({byte_unit})")
    _phase_axis(low, names)
    fig.align_ylabels([top, low])
    keys = [_key("NCCL kernels"), _key("memcpy", light=True)]
    return _finish(fig, top, keys, out, "data_movement_per_phase")


def execution_order(phases: pl.DataFrame) -> list[str]:
    """Phase paths in order of their first start (the order the run executes them)."""
    return (
        phases.group_by("path")
        .agg(pl.col("start_ns").min())
        .sort("start_ns", "path")["path"]
        .to_list()
    )


def _energy_bars(ax: Axes, per: pl.DataFrame, names: list[str], factor: float) -> list[Any]:
    """Per-GPU bars (told apart by hatch), or medians over GPUs past ``MAX_GPU_BARS``: keys."""
    colors = [phase_hex(n.split("/", 1)[1]) for n in names]
    devices = sorted(per["device"].unique().to_list())
    if len(devices) > MAX_GPU_BARS:
        stats = per.group_by("path").agg(
            pl.col("energy_j").quantile(q, "linear").alias(str(q)) for q in _QS
        )
        by_path = {r[0]: r[1:] for r in stats.select("path", *map(str, _QS)).iter_rows()}
        qs = [[by_path[n][k] / factor for n in names] for k in range(3)]
        ax.bar(range(len(names)), qs[1], 0.7, color=colors, edgecolor="white", linewidth=0.3)
        whisker = _whisker(ax, range(len(names)), qs, "p10–p90 over GPUs")
        return [_key(f"median over {len(devices)} GPUs"), whisker]
    width = 0.8 / len(devices)
    keys: list[Any] = []
    for k, (device, hatch) in enumerate(zip(devices, HATCHES, strict=False)):
        values = dict(per.filter(pl.col("device") == device).select("path", "energy_j").iter_rows())
        x = [i - 0.4 + width * (k + 0.5) for i in range(len(names))]
        heights = [values.get(n, 0.0) / factor for n in names]
        ax.bar(x, heights, width, color=colors, hatch=hatch, edgecolor="white", linewidth=0.3)
        keys.append(_key(device_label(device), hatch=hatch))
    return keys


def energy_per_phase_device(
    phase_devices: pl.DataFrame, out: Path, order: list[str] | None = None
) -> list[Path]:
    """Energy of each phase per GPU, all steps: a bar per GPU, or the median with p10–p90.

    One bar per GPU (told apart by hatch) up to :data:`MAX_GPU_BARS` GPUs, else per phase the
    median over GPUs with a p10–p90 whisker.

    Fixed canvas; phases in ``order`` (execution order, from :func:`execution_order`), others
    after, by name; each in its phase colour.
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
    factor, unit = _unit(_max(per["energy_j"]), _ENERGY_UNITS)
    fig, ax = plt.subplots(figsize=CANVAS)
    keys = _energy_bars(ax, per, names, factor)
    _phase_axis(ax, [n.split("/", 1)[1] for n in names])
    ax.set_ylabel(f"energy per GPU, all steps ({unit})")
    ax.set_title("Energy per phase per GPU")
    title = (
        "colour: phase" if per["device"].n_unique() > MAX_GPU_BARS else "GPU (hatch); colour: phase"
    )
    return _finish(fig, ax, keys, out, "energy_per_phase_device", title)


def energy_figure(phase_devices: pl.DataFrame, phases: pl.DataFrame, out: Path) -> list[Path]:
    """:func:`energy_per_phase_device` with the phases in their execution order."""
    return energy_per_phase_device(phase_devices, out, execution_order(phases))
