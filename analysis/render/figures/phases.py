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

from nvtx_phases.naming import phase_color

from ...aggregate.shares import share_over_steps, step_shares
from ...aggregate.step_stack import OTHER, phase_totals, step_stack
from ...frames import int_value
from ...normalize.devices import device_label
from ...phase_paths import is_step_phase
from ..outputs.atomic import atomic_write
from .captions import POOL_STEM
from .pool_scope import FIGURE_POOL

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


def save_figure(fig: plt.Figure, out: Path, stem: str, *, data: pl.DataFrame) -> list[Path]:
    """Write ``fig`` as ``stem``.png (at :data:`DPI`) and .svg under ``out`` (atomically); close it.

    ``data``: exactly the numbers the figure draws (bars, lines, whiskers, bins), written beside
    it as ``stem``.csv so a paper can re-plot them and a test can check them. Inside
    :func:`~analysis.render.figures.pool_scope.for_pool` the titles name the pool and the files are ``stem__pool-P``.
    """
    pool = FIGURE_POOL.get()
    if pool is not None:
        stem = f"{stem}{POOL_STEM}{pool}"
        for ax in fig.axes:
            if ax.get_title():
                ax.set_title(f"Pool {pool}: {ax.get_title()}")

    def writer(ext: str) -> Callable[[Path], None]:
        return lambda p: fig.savefig(p, format=ext, dpi=DPI, **_SAVE_OPTIONS[ext])

    paths = [atomic_write(out / f"{stem}.{ext}", writer(ext)) for ext in ("png", "svg")]
    plt.close(fig)
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
    fig: plt.Figure,
    ax: Axes,
    keys: list[Any],
    out: Path,
    stem: str,
    data: pl.DataFrame,
    title: str = "colour: phase",
) -> list[Path]:
    """Legend outside the data, right of the axes (as ``phase_time_per_step``); lay out; save."""
    style: dict[str, Any] = {"loc": "upper left", "frameon": False, "alignment": "left"}
    ax.legend(
        handles=keys, bbox_to_anchor=(1.01, 1.0), title=title, fontsize=8, title_fontsize=8, **style
    )
    fig.tight_layout()
    return save_figure(fig, out, stem, data=data)


def _values(data: pl.DataFrame, column: str, factor: float = 1.0) -> list[float]:
    """``column`` / ``factor`` as floats, NaN where null: nothing is drawn for a missing value."""
    return (data[column].cast(pl.Float64) / factor).fill_null(float("nan")).to_list()


def phase_time_per_step(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars of each phase's wall time per step (binned means beyond ``MAX_STEP_BARS``).

    A fixed canvas whatever the number of steps; phases stacked bottom to top in execution
    order, then ``other``; the legend lists them top to bottom as the stack does. Data:
    :func:`~analysis.aggregate.step_stack.step_stack`, one row per drawn segment.
    """
    stack = step_stack(phases).rename({"canonical": "phase"})
    if stack.is_empty():
        return []
    bars = stack.select("bar", "first_step").unique().sort("first_step")["bar"].to_list()
    where = {bar: i for i, bar in enumerate(bars)}
    binned = stack["n_steps"].max() != 1
    fig, ax = plt.subplots(figsize=(8, 4))
    for (name,), rows in stack.sort("position").partition_by("phase", as_dict=True).items():
        ax.bar(
            [where[b] for b in rows["bar"]],
            rows["wall_ms"].to_list(),
            bottom=rows["bottom_ms"].to_list(),
            label=str(name),
            color="#d9d9d9" if name == OTHER else phase_hex(str(name)),
            edgecolor="white",
            linewidth=0.3 if len(bars) > 20 else 0.5,
        )
    ticks = list(range(0, len(bars), max(1, len(bars) // 10)))
    ax.set_xticks(ticks, [bars[i] for i in ticks], rotation=30 if binned else 0, fontsize=8)
    ax.set_xlabel("steps (mean per step in each bin)" if binned else "step")
    ax.set_ylabel("wall time (ms)")
    ax.set_title("Phase time per step")
    handles, labels = ax.get_legend_handles_labels()
    # top of the legend = top of the stack
    style: dict[str, Any] = {"loc": "center left", "frameon": False, "fontsize": 8}
    ax.legend(handles[::-1], labels[::-1], bbox_to_anchor=(1.0, 0.5), **style)
    fig.tight_layout()
    return save_figure(fig, out, "phase_time_per_step", data=stack)


def busy_idle_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Stacked bars per phase: GPU busy (phase colour) and idle (light, hatched), all steps and GPUs.

    A fixed canvas whatever the number of steps, phases and GPUs; phases in execution order.
    Data: ``phase, gpu_busy_ns, gpu_idle_ns`` (sums over steps, processes and GPUs).
    """
    data = phase_totals(phases, "gpu_busy_ns", "idle_ns").rename(
        {"canonical": "phase", "idle_ns": "gpu_idle_ns"}
    )
    if data.is_empty() or _total(data, "gpu_busy_ns", "gpu_idle_ns") == 0:
        return []
    names = data["phase"].to_list()
    colors = [phase_hex(n) for n in names]
    factor, unit = _unit(_max(data["gpu_busy_ns"] + data["gpu_idle_ns"]), _TIME_UNITS)
    busy = _values(data, "gpu_busy_ns", factor)
    x = list(range(len(names)))
    fig, ax = plt.subplots(figsize=CANVAS)
    ax.bar(x, busy, 0.7, color=colors, edgecolor="white", linewidth=0.3)
    ax.bar(x, _values(data, "gpu_idle_ns", factor), 0.7, bottom=busy, **_light(colors))
    _phase_axis(ax, names)
    ax.set_ylabel(f"GPU time, all GPUs and steps ({unit})")
    ax.set_title("GPU busy vs idle per phase")
    keys = [_key("GPU idle", light=True), _key("GPU busy")]  # as stacked: idle on top
    return _finish(fig, ax, keys, out, "busy_idle_per_phase", data)


_SHARE_COLUMNS = {
    f"{what}_share_{q}": f"{what}_share_{q}_pct"
    for what in ("time", "energy")
    for q in ("p10", "median", "p90")
}


def phase_share(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase: median share of the step's time, and of its energy when measured (hatched).

    Shares as :mod:`analysis.aggregate.shares` defines them (of the ``step`` range, gaps
    between phases included); whiskers p10–p90 over the steps where the phase ran. Fixed
    canvas; phases in execution order, in their colours. Data: ``phase, n_steps`` and
    ``{time,energy}_share_{p10,median,p90}_pct``.
    """
    data = share_over_steps(step_shares(phases))
    if data.is_empty():
        return []
    data = data.rename({"canonical": "phase", **_SHARE_COLUMNS})
    names = data["phase"].to_list()
    colors = [phase_hex(n) for n in names]
    has_energy = data["energy_share_median_pct"].is_not_null().any()
    n_steps = step_shares(phases)["step"].n_unique()
    width = 0.4 if has_energy else 0.7
    fig, ax = plt.subplots(figsize=CANVAS)
    keys: list[Any] = [_key("time share")]
    bars = [("time", -width / 2 if has_energy else 0.0, {"color": colors, "edgecolor": "white"})]
    if has_energy:
        keys.append(_key("energy share", light=True))
        bars.append(("energy", width / 2, _light(colors)))
    whisker = None
    for quantity, shift, style in bars:
        x = [i + shift for i in range(len(names))]
        qs = [_values(data, f"{quantity}_share_{q}_pct") for q in ("p10", "median", "p90")]
        ax.bar(x, qs[1], width, **style)  # type: ignore[arg-type]
        whisker = _whisker(ax, x, qs, "p10–p90 over steps") if n_steps > 1 else None
    _phase_axis(ax, names)
    ax.set_ylabel("share of step (%)")
    what = "time and energy" if has_energy else "time"
    ax.set_title(f"Share of the step's {what} per phase (median over {n_steps} steps)")
    keys += [whisker] if whisker else []
    return _finish(fig, ax, keys, out, "phase_share", data)


def data_movement_per_phase(phases: pl.DataFrame, out: Path) -> list[Path]:
    """Per phase, summed over steps and GPUs: NCCL and memcpy time (top), memcpy bytes (bottom).

    Bars only (phases are categories: no line joins them); fixed canvas; execution order.
    Data: ``phase, nccl_ns, memcpy_ns, memcpy_bytes``.
    """
    data = phase_totals(phases, "nccl_ns", "memcpy_ns", "memcpy_bytes").rename(
        {"canonical": "phase"}
    )
    if data.is_empty() or _total(data, "nccl_ns", "memcpy_ns") == 0:
        return []
    names = data["phase"].to_list()
    colors = [phase_hex(n) for n in names]
    x = list(range(len(names)))
    tf, time_unit = _unit(_max(data["nccl_ns"], data["memcpy_ns"]), _TIME_UNITS)
    bf, byte_unit = _unit(_max(data["memcpy_bytes"]), _BYTE_UNITS)
    fig, (top, low) = plt.subplots(2, 1, figsize=CANVAS, sharex=True, height_ratios=(3, 2))
    nccl = _values(data, "nccl_ns", tf)
    top.bar([i - 0.2 for i in x], nccl, 0.4, color=colors, edgecolor="white", linewidth=0.3)
    top.bar([i + 0.2 for i in x], _values(data, "memcpy_ns", tf), 0.4, **_light(colors))
    top.set_ylabel(f"time, all GPUs\nand steps ({time_unit})")
    top.set_title("Data movement per phase")
    low.bar(x, _values(data, "memcpy_bytes", bf), 0.4, **_light(colors))
    low.set_ylabel(f"memcpy bytes\n({byte_unit})")
    _phase_axis(low, names)
    fig.align_ylabels([top, low])
    keys = [_key("NCCL kernels"), _key("memcpy", light=True)]
    return _finish(fig, top, keys, out, "data_movement_per_phase", data)


def execution_order(phases: pl.DataFrame) -> list[str]:
    """Phase paths in order of their first start (the order the run executes them)."""
    return (
        phases.group_by("path")
        .agg(pl.col("start_ns").min())
        .sort("start_ns", "path")["path"]
        .to_list()
    )


def energy_per_device(phase_devices: pl.DataFrame, order: list[str] | None = None) -> pl.DataFrame:
    """What ``energy_per_phase_device`` draws: energy per phase of the step and GPU, all steps.

    Up to :data:`MAX_GPU_BARS` GPUs ``phase, path, device, gpu, energy_j`` per (phase, GPU);
    beyond, ``phase, path, n_gpus, energy_{p10,median,p90}_j`` over the GPUs. Phases in
    ``order`` (paths), others after by name.
    """
    data = phase_devices.filter(is_step_phase() & pl.col("energy_j").is_not_null())
    per = data.group_by("path", "device").agg(pl.col("energy_j").sum())
    present = sorted(set(per["path"].to_list()))
    ranked = [p for p in (order or []) if p in present]
    ranked += [p for p in present if p not in ranked]
    rank = pl.DataFrame(
        {"path": ranked, "order": range(len(ranked))},
        schema={"path": pl.String, "order": pl.Int64},
    )
    per = per.join(rank, on="path").with_columns(
        pl.col("path").str.split("/").list.last().alias("phase")
    )
    if per["device"].n_unique() > MAX_GPU_BARS:
        quantiles = (pl.col("energy_j").quantile(q, "linear") for q in _QS)
        names = ("energy_p10_j", "energy_median_j", "energy_p90_j")
        return (
            per.group_by("order", "phase", "path")
            .agg(
                pl.len().cast(pl.Int64).alias("n_gpus"),
                *(e.alias(n) for e, n in zip(quantiles, names, strict=True)),
            )
            .sort("order")
            .drop("order")
        )
    labels = pl.col("device").map_elements(device_label, return_dtype=pl.String)
    return per.sort("order", "device").select(
        "phase", "path", "device", labels.alias("gpu"), "energy_j"
    )


def _energy_bars(ax: Axes, per: pl.DataFrame, paths: list[str], factor: float) -> list[Any]:
    """Per-GPU bars (told apart by hatch), or medians over GPUs past ``MAX_GPU_BARS``: keys."""
    colors = [phase_hex(p.split("/", 1)[1]) for p in paths]
    x = range(len(paths))
    if "n_gpus" in per.columns:
        qs = [_values(per, c, factor) for c in ("energy_p10_j", "energy_median_j", "energy_p90_j")]
        ax.bar(x, qs[1], 0.7, color=colors, edgecolor="white", linewidth=0.3)
        whisker = _whisker(ax, x, qs, "p10–p90 over GPUs")
        return [_key(f"median over {int_value(per['n_gpus'].max())} GPUs"), whisker]
    devices = per["device"].unique(maintain_order=True).sort().to_list()
    width = 0.8 / len(devices)
    keys: list[Any] = []
    for k, (device, hatch) in enumerate(zip(devices, HATCHES, strict=False)):
        values = dict(per.filter(pl.col("device") == device).select("path", "energy_j").iter_rows())
        heights = [values.get(p, float("nan")) / factor for p in paths]  # none: no bar, not 0
        x_k = [i - 0.4 + width * (k + 0.5) for i in x]
        ax.bar(x_k, heights, width, color=colors, hatch=hatch, edgecolor="white", linewidth=0.3)
        keys.append(_key(device_label(device), hatch=hatch))
    return keys


def energy_per_phase_device(
    phase_devices: pl.DataFrame, out: Path, order: list[str] | None = None
) -> list[Path]:
    """Energy of each phase per GPU, all steps: a bar per GPU, or the median with p10–p90.

    One bar per GPU (told apart by hatch) up to :data:`MAX_GPU_BARS` GPUs, else per phase the
    median over GPUs with a p10–p90 whisker. Fixed canvas; phases in ``order`` (execution
    order, from :func:`execution_order`), others after, by name; each in its phase colour.
    Data: :func:`energy_per_device`.
    """
    if "energy_j" not in phase_devices.columns:
        return []
    per = energy_per_device(phase_devices, order)
    if per.is_empty():
        return []
    paths = per["path"].unique(maintain_order=True).to_list()
    value = "energy_j" if "energy_j" in per.columns else "energy_p90_j"
    factor, unit = _unit(_max(per[value]), _ENERGY_UNITS)
    fig, ax = plt.subplots(figsize=CANVAS)
    keys = _energy_bars(ax, per, paths, factor)
    _phase_axis(ax, [p.split("/", 1)[1] for p in paths])
    ax.set_ylabel(f"energy per GPU, all steps ({unit})")
    ax.set_title("Energy per phase per GPU")
    title = "colour: phase" if "n_gpus" in per.columns else "GPU (hatch); colour: phase"
    return _finish(fig, ax, keys, out, "energy_per_phase_device", per, title)


def energy_figure(phase_devices: pl.DataFrame, phases: pl.DataFrame, out: Path) -> list[Path]:
    """:func:`energy_per_phase_device` with the phases in their execution order."""
    return energy_per_phase_device(phase_devices, out, execution_order(phases))
