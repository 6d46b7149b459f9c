"""GPU power figures: an overview of the whole run and a detail of a few chosen steps.

``power_timeline`` (overview): one axis, one line per GPU (tab10 colours, labelled by
:func:`~analysis.normalize.devices.device_label`); past :data:`MAX_POINTS` samples per GPU, the
mean per driver phase (or per bin of whole steps) with a light min–max band, so the file stays
small whatever the run's length. Above it, a thin phase ribbon: the driver phases in their NVTX
colours, one ``broken_barh`` per phase. Each figure's numbers go to ``NAME.csv`` beside it.

``power_timeline_detail``: the chosen steps (``--detail-steps``; default the median-duration and
the longest step), one panel each, sample-level lines over phase bands, time since step start.

Both on a fixed canvas whatever the number of steps and GPUs; legends outside on the right.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: clusters and CI have no display
import matplotlib.pyplot as plt
import numpy as np
import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ...aggregate.step_stack import (
    check_detail_steps,  # noqa: F401 (the CLI's import)
    resolve_detail_steps,
    step_windows,
)
from ...frames import int_value
from ...model import WINDOW
from ...normalize.devices import device_label
from ...phase_paths import driver_phases
from .phases import phase_hex, save_figure

#: both power figures' canvas (inches), whatever the number of steps and GPUs
CANVAS = (8.0, 4.5)
#: past this many samples per GPU the overview draws per-bin means (and :data:`BINS` bins)
MAX_POINTS = 4000
BINS = 300
#: past this many GPUs one line each is unreadable: the median over GPUs, p10–p90 band
MAX_GPU_LINES = 10
#: past this many spans of one phase the ribbon is rasterized in the SVG
RASTER_SPANS = 200
_GPU_COLORS = [f"C{k}" for k in range(10)]  # tab10, the default cycle


def bin_edges(samples: pl.DataFrame, phases: pl.DataFrame, bins: int) -> tuple[np.ndarray, str]:
    """Overview bin starts (ns) and what one bin is, in words.

    Bins follow the run's structure, so a bin never cuts a phase at a varying point (the means
    would beat): one bin per driver phase (from its start to the next one's) while there are at
    most ``2 * bins`` of them, else bins of whole steps (about ``bins`` of them); equal widths
    only for a run without steps.
    """
    t0, t1 = int_value(samples["t_ns"].min() or 0), int_value(samples["t_ns"].max() or 0)
    starts = driver_phases(phases)["start_ns"].unique().sort().to_numpy()
    if 0 < len(starts) <= 2 * bins:
        return np.unique(np.concatenate(([min(t0, starts[0])], starts))), "phase"
    steps = (
        phases.filter((pl.col("path") == "step") & (pl.col("attribution") == WINDOW))
        .group_by("step")
        .agg(pl.col("start_ns").min())
        .sort("start_ns")
    )
    if steps.height:
        k = -(-steps.height // bins)
        edges = steps["start_ns"].to_numpy()[::k]
        per = "step" if k == 1 else f"{k} steps"
        return np.unique(np.concatenate(([min(t0, edges[0])], edges))), per
    width = max(1, -(-(t1 - t0 + 1) // bins))
    factor, unit = _time_unit(t1 - t0)
    return np.arange(t0, t1 + 1, width), f"{width / factor:.3g} {unit}"


def binned_power(samples: pl.DataFrame, edges: np.ndarray) -> pl.DataFrame:
    """Per device and bin (``edges``: starts): ``start_ns, end_ns, t_ns`` (centre), mean, min, max W."""
    t = samples["t_ns"].to_numpy()
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
    ends = np.append(edges[1:], max(int(t.max()), int(edges[-1])) + 1)
    spans = pl.DataFrame({"bin": np.arange(len(edges)), "start_ns": edges, "end_ns": ends})
    spans = spans.with_columns(t_ns=(pl.col("start_ns") + pl.col("end_ns")) // 2)
    return (
        samples.with_columns(bin=pl.Series(index, dtype=pl.Int64))
        .group_by("device", "bin")
        .agg(
            pl.col("power_w").mean().alias("mean"),
            pl.col("power_w").min().alias("min"),
            pl.col("power_w").max().alias("max"),
        )
        .join(spans, on="bin")
        .sort("device", "bin")
    )


def _time_unit(span_ns: float) -> tuple[float, str]:
    """Hours for a run over 2 h, seconds over 2 s, else milliseconds."""
    units = ((3600e9, "h"), (1e9, "s"))
    return next(((f, u) for f, u in units if span_ns >= 2 * f), (1e6, "ms"))


#: the columns of ``power_timeline.csv``: ``kind`` is ``phase`` (the ribbon: ``label`` the
#: phase, its ``step``, ``start_ns``–``end_ns``), ``gpu`` (a GPU's line: a sample, or the mean
#: of a bin ``start_ns``–``end_ns`` drawn at its centre ``t_ns``), ``band`` (min–max over all
#: GPUs per bin) or ``median`` (median over GPUs, with the p10–p90 band); times on the run clock
OVERVIEW_COLUMNS: dict[str, pl.DataType] = {
    **dict.fromkeys(("kind", "label", "device"), pl.String()),
    **dict.fromkeys(("step", "start_ns", "end_ns", "t_ns"), pl.Int64()),
    **dict.fromkeys(("power_w", "power_low_w", "power_high_w"), pl.Float64()),
}


def _table(parts: list[pl.DataFrame], columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """``parts`` stacked in ``columns`` (with their types; a column a part lacks is null)."""
    rows = pl.concat(parts, how="diagonal_relaxed")
    return rows.select(
        (pl.col(c) if c in rows.columns else pl.lit(None)).cast(t).alias(c)
        for c, t in columns.items()
    )


def _labelled(frame: pl.DataFrame, kind: str) -> pl.DataFrame:
    """``frame`` with ``kind`` and each device's ``label`` (:func:`device_label`)."""
    labels = pl.col("device").map_elements(device_label, return_dtype=pl.String)
    return frame.with_columns(pl.lit(kind).alias("kind"), labels.alias("label"))


def overview_data(phases: pl.DataFrame, samples: pl.DataFrame) -> tuple[pl.DataFrame, str | None]:
    """What ``power_timeline`` draws (:data:`OVERVIEW_COLUMNS`) and a bin in words (None: samples).

    One line per GPU: its samples, or past :data:`MAX_POINTS` samples per GPU the mean per bin
    (:func:`bin_edges`) with the min–max band over GPUs; past :data:`MAX_GPU_LINES` GPUs the
    median over GPUs of their bin means, with the p10–p90 band.
    """
    ribbon = driver_phases(phases).select(
        pl.lit("phase").alias("kind"), pl.col("canonical").alias("label"), pl.exclude("canonical")
    )
    n = samples["device"].n_unique()
    dense = int_value(samples.group_by("device").len()["len"].max() or 0) > MAX_POINTS
    if n <= MAX_GPU_LINES and not dense:
        lines = [_labelled(samples.sort("device", "t_ns"), "gpu")]
        return _table([ribbon, *lines], OVERVIEW_COLUMNS), None
    edges, per = bin_edges(samples, phases, BINS)
    binned = binned_power(samples, edges)
    span = binned.group_by("start_ns", "end_ns", "t_ns", maintain_order=True)
    if n > MAX_GPU_LINES:
        stats = span.agg(
            pl.col("mean").quantile(q, "linear").alias(name)
            for q, name in ((0.1, "power_low_w"), (0.5, "power_w"), (0.9, "power_high_w"))
        )
        label = pl.lit(f"median of {n} GPUs").alias("label")
        lines = [stats.sort("t_ns").with_columns(pl.lit("median").alias("kind"), label)]
    else:
        band = span.agg(
            pl.col("min").min().alias("power_low_w"), pl.col("max").max().alias("power_high_w")
        )
        label = pl.lit("min–max, all GPUs").alias("label")
        lines = [
            _labelled(binned.rename({"mean": "power_w"}).drop("min", "max"), "gpu"),
            band.sort("t_ns").with_columns(pl.lit("band").alias("kind"), label),
        ]
    return _table([ribbon, *lines], OVERVIEW_COLUMNS), per


def _ribbon(ax: Axes, bands: pl.DataFrame, factor: float, t0: int = 0) -> list[str]:
    """The phase ribbon (``label``, ``start_ns``, ``end_ns``): one ``broken_barh`` per phase.

    Returns the phases in execution order (first start).
    """
    order = _order(bands)
    for name in order:
        rows = bands.filter(pl.col("label") == name)
        spans = [
            ((s - t0) / factor, (e - s) / factor)
            for s, e in rows.select("start_ns", "end_ns").iter_rows()
        ]
        bars = ax.broken_barh(spans, (0, 1), facecolors=phase_hex(name), linewidth=0)
        # thousands of sub-pixel spans: a bitmap in the SVG, not thousands of paths
        bars.set_rasterized(len(spans) > RASTER_SPANS)
    ax.set_ylim(0, 1)
    ax.set_yticks([])
    ax.tick_params(axis="x", labelbottom=False, length=0)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return order


def _order(bands: pl.DataFrame) -> list[str]:
    """Phase names (``label``) in execution order (first start)."""
    first = bands.group_by("label").agg(pl.col("start_ns").min()).sort("start_ns", "label")
    return first["label"].to_list()


def _legends(fig: Figure, ax: Axes, gpu_handles: list[Any], order: list[str]) -> None:
    """GPU legend (upper) and phase legend (lower), outside the data on the right."""
    style: dict[str, Any] = {"frameon": False, "fontsize": 7, "title_fontsize": 7}
    style["alignment"] = "left"
    gpus = ax.legend(
        handles=gpu_handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="GPU", **style
    )
    ax.add_artist(gpus)
    keys = [Patch(facecolor=phase_hex(n), label=n) for n in order]
    ax.legend(handles=keys, loc="lower left", bbox_to_anchor=(1.01, 0.0), title="phase", **style)


def _overview_lines(ax: Axes, data: pl.DataFrame, per: str | None, factor: float) -> list[Any]:
    """The lines and bands of :func:`overview_data` (its non-phase rows); their handles.

    One light grey band behind binned lines spans the min–max over all GPUs (one band per GPU
    would cover the lines with overlapping colour).
    """
    handles: list[Any] = []
    for kind, color, alpha in (("band", "#bbbbbb", 0.35), ("median", "#1f77b4", 0.2)):
        rows = data.filter(pl.col("kind") == kind)
        if rows.height:
            x = (rows["t_ns"] / factor).to_numpy()
            label = (
                "p10–p90 over GPUs"
                if kind == "median"
                else f"{rows['label'][0]}\n(lines: mean per {per})"
            )
            low, high = rows["power_low_w"].to_numpy(), rows["power_high_w"].to_numpy()
            band = ax.fill_between(x, low, high, color=color, alpha=alpha, lw=0, label=label)
            handles.append(band)
            if kind == "median":
                (line,) = ax.plot(
                    x, rows["power_w"].to_numpy(), color=color, lw=0.8, label=rows["label"][0]
                )
                handles.insert(0, line)
    gpus = data.filter(pl.col("kind") == "gpu")
    for k, device in enumerate(sorted(gpus["device"].unique().to_list())):
        rows = gpus.filter(pl.col("device") == device)
        x, y = (rows["t_ns"] / factor).to_numpy(), rows["power_w"].to_numpy()
        color = _GPU_COLORS[k % len(_GPU_COLORS)]
        (line,) = ax.plot(x, y, color=color, lw=0.9, label=rows["label"][0])
        handles.insert(k, line)
    return handles


def overview_figure(phases: pl.DataFrame, samples: pl.DataFrame) -> tuple[Figure, pl.DataFrame]:
    """The ``power_timeline`` figure (not saved), ribbon above GPU lines, and its data."""
    data, per = overview_data(phases, samples)
    bands = data.filter(pl.col("kind") == "phase")
    t1 = max(int_value(samples["t_ns"].max() or 0), int_value(bands["end_ns"].max() or 0))
    factor, unit = _time_unit(t1)
    fig, (top, ax) = plt.subplots(
        2, 1, figsize=CANVAS, sharex=True, gridspec_kw={"height_ratios": (1, 14), "hspace": 0.04}
    )
    order = _ribbon(top, bands, factor)
    handles = _overview_lines(ax, data, per, factor)
    ax.set_xlim(0, t1 / factor)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time ({unit}, run clock)")
    ax.set_ylabel("power (W)")
    n_steps, n_gpus = bands["step"].n_unique(), samples["device"].n_unique()
    top.set_title(f"GPU power over the run ({n_steps} steps, {n_gpus} GPUs)", fontsize=10)
    _legends(fig, ax, handles, order)
    fig.subplots_adjust(left=0.08, right=0.78, top=0.92, bottom=0.12)
    return fig, data


def power_timeline(phases: pl.DataFrame, samples: pl.DataFrame | None, out: Path) -> list[Path]:
    """Power per GPU over the whole run, under a ribbon of the driver phases (see the module).

    Data (``power_timeline.csv``): :func:`overview_data`.
    """
    if samples is None or samples.is_empty():
        return []
    fig, data = overview_figure(phases, samples)
    return save_figure(fig, out, "power_timeline", data=data)


#: the columns of ``power_timeline_detail.csv``: per panel (``panel_step``) the driver phases
#: overlapping it (``kind`` ``phase``: ``label``, ``step``, ``start_ns``–``end_ns`` and the
#: same in ms since the step's start ``step_start_ns``) and each GPU's samples (``gpu``: ``t_ns``,
#: ``time_in_step_ms``, ``power_w``; one sample either side of the step, so lines reach its edges)
DETAIL_COLUMNS: dict[str, pl.DataType] = {
    "panel_step": pl.Int64(),
    **dict.fromkeys(("kind", "label", "device"), pl.String()),
    **dict.fromkeys(("step", "step_start_ns", "start_ns", "end_ns"), pl.Int64()),
    **dict.fromkeys(("start_in_step_ms", "end_in_step_ms"), pl.Float64()),
    "t_ns": pl.Int64(),
    **dict.fromkeys(("time_in_step_ms", "power_w"), pl.Float64()),
}


def detail_data(
    phases: pl.DataFrame, samples: pl.DataFrame, windows: dict[int, tuple[int, int]]
) -> pl.DataFrame:
    """What ``power_timeline_detail`` draws for the steps ``windows`` names: :data:`DETAIL_COLUMNS`."""
    bands = driver_phases(phases).rename({"canonical": "label"})
    t = pl.col("t_ns")
    parts = []
    for step, (start, end) in windows.items():
        at = [pl.lit(step).alias("panel_step"), pl.lit(start).alias("step_start_ns")]
        inside = bands.filter((pl.col("end_ns") > start) & (pl.col("start_ns") < end))
        parts.append(
            inside.with_columns(
                *at,
                pl.lit("phase").alias("kind"),
                ((pl.col("start_ns") - start) / 1e6).alias("start_in_step_ms"),
                ((pl.col("end_ns") - start) / 1e6).alias("end_in_step_ms"),
            )
        )
        margin = max(end - start, 2_000_000_000)  # wider than any sampling interval
        near = samples.filter(t.is_between(start - margin, end + margin)).sort("device", "t_ns")
        edges = (
            near.filter(t < start).group_by("device").last(),
            near.filter(t > end).group_by("device").first(),
        )
        lines = pl.concat([edges[0], near.filter(t.is_between(start, end)), edges[1]])
        parts.append(
            _labelled(lines.sort("device", "t_ns"), "gpu").with_columns(
                *at, ((t - start) / 1e6).alias("time_in_step_ms")
            )
        )
    return _table(parts, DETAIL_COLUMNS)


def _detail_panel(top: Axes, ax: Axes, data: pl.DataFrame, dur_ms: float) -> list[Any]:
    """One step's rows of :func:`detail_data`: ribbon, phase bands, per-GPU lines (handles)."""
    bands = data.filter(pl.col("kind") == "phase")
    _ribbon(top, bands, 1e6, int(data["step_start_ns"][0]))
    for name, s, e in bands.select("label", "start_in_step_ms", "end_in_step_ms").iter_rows():
        ax.axvspan(s, e, color=phase_hex(name), alpha=0.22, lw=0)
    handles = []
    gpus = data.filter(pl.col("kind") == "gpu")
    for k, device in enumerate(sorted(gpus["device"].unique().to_list())):
        rows = gpus.filter(pl.col("device") == device)
        color = _GPU_COLORS[k % len(_GPU_COLORS)]
        x, y = rows["time_in_step_ms"].to_numpy(), rows["power_w"].to_numpy()
        (line,) = ax.plot(x, y, color=color, lw=0.9, label=rows["label"][0])
        handles.append(line)
    ax.set_xlim(0, dur_ms)
    return handles


def detail_figure(
    phases: pl.DataFrame, samples: pl.DataFrame, steps: pl.DataFrame, chosen: dict[int, str]
) -> tuple[Figure, pl.DataFrame]:
    """The ``power_timeline_detail`` figure (not saved), one panel per chosen step, and its data."""
    windows = {r[0]: (r[1], r[2]) for r in step_windows(steps).iter_rows()}
    data = detail_data(phases, samples, {step: windows[step] for step in chosen})
    n = len(chosen)
    fig, axes = plt.subplots(
        2,
        n,
        figsize=CANVAS,
        sharex="col",
        sharey="row",
        squeeze=False,
        gridspec_kw={"height_ratios": (1, 14), "hspace": 0.04, "wspace": 0.08},
    )
    handles: list[Any] = []
    for k, (step, role) in enumerate(chosen.items()):
        top, ax = axes[0, k], axes[1, k]
        dur = (windows[step][1] - windows[step][0]) / 1e6
        handles = _detail_panel(top, ax, data.filter(pl.col("panel_step") == step), dur)
        role_text = "" if role == "chosen" else f", {role}"
        top.set_title(f"step {step} ({dur:,.0f} ms{role_text})", fontsize=8)
        ax.set_xlabel("time in step (ms)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[1, 0].set_ylabel("power (W)")
    axes[1, 0].set_ylim(bottom=0)
    fig.suptitle(
        f"GPU power within step{'s' if n > 1 else ''} {', '.join(map(str, chosen))}", fontsize=10
    )
    bands = driver_phases(phases).rename({"canonical": "label"})
    _legends(fig, axes[1, -1], handles, _order(bands))
    fig.subplots_adjust(left=0.08, right=0.78, top=0.86, bottom=0.12)
    return fig, data


def power_timeline_detail(
    phases: pl.DataFrame,
    samples: pl.DataFrame | None,
    steps: pl.DataFrame,
    out: Path,
    detail_steps: str | None = None,
) -> list[Path]:
    """Power per GPU within a few steps (``detail_steps``, as ``--steps``; default: see the module).

    Data (``power_timeline_detail.csv``): :func:`detail_data`.
    """
    if samples is None or samples.is_empty():
        return []
    chosen = resolve_detail_steps(step_windows(steps), detail_steps)
    if not chosen:
        return []
    fig, data = detail_figure(phases, samples, steps, chosen)
    return save_figure(fig, out, "power_timeline_detail", data=data)
