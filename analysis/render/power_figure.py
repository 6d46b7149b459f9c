"""GPU power figures: an overview of the whole run and a detail of a few chosen steps.

``power_timeline`` (overview): one axis, one line per GPU (tab10 colours, labelled by
:func:`~analysis.normalize.devices.device_label`); past :data:`MAX_POINTS` samples per GPU, the
mean per driver phase (or per bin of whole steps) with a light min–max band, so the file stays
small whatever the run's length. Above it, a thin phase ribbon: the driver phases in their NVTX colours, one ``broken_barh`` per phase.

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

from analysis.errors import InputError
from analysis.frames import int_value
from analysis.model import WINDOW
from analysis.normalize.devices import device_label
from analysis.render.figures import phase_hex, save_figure
from analysis.run.select import parse_steps, steps_text

#: both power figures' canvas (inches), whatever the number of steps and GPUs
CANVAS = (8.0, 4.5)
#: past this many samples per GPU the overview draws per-bin means (and :data:`BINS` bins)
MAX_POINTS = 4000
BINS = 300
#: the most steps ``--detail-steps`` may choose (one panel each)
MAX_DETAIL_STEPS = 4
#: past this many GPUs one line each is unreadable: the median over GPUs, p10–p90 band
MAX_GPU_LINES = 10
#: past this many spans of one phase the ribbon is rasterized in the SVG
RASTER_SPANS = 200
_GPU_COLORS = [f"C{k}" for k in range(10)]  # tab10, the default cycle
_OPTION = "--detail-steps"


def driver_phases(phases: pl.DataFrame) -> pl.DataFrame:
    """The driver's top-level phases (``step/X``, window attribution): step, name, start, end."""
    return (
        phases.filter(
            pl.col("path").str.starts_with("step/")
            & (pl.col("path").str.count_matches("/") == 1)
            & (pl.col("attribution") == WINDOW)
        )
        .select("step", "canonical", "start_ns", "end_ns")
        .sort("start_ns")
    )


def step_windows(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps table as ``step, start_ns, end_ns, dur_ns``, by step."""
    if steps.is_empty() or "step_start_ns" not in steps.columns:
        return pl.DataFrame(schema={"step": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64})
    return (
        steps.select(
            "step", pl.col("step_start_ns").alias("start_ns"), pl.col("step_end_ns").alias("end_ns")
        )
        .drop_nulls()
        .with_columns(dur_ns=pl.col("end_ns") - pl.col("start_ns"))
        .sort("step")
    )


def default_detail_steps(windows: pl.DataFrame) -> dict[int, str]:
    """The median-duration step (the lower median) and the longest step, with their role."""
    if windows.is_empty():
        return {}
    ranked = windows.sort("dur_ns", "step")["step"].to_list()
    median, longest = ranked[(len(ranked) - 1) // 2], ranked[-1]
    if median == longest:
        return {median: "median and longest"}
    return dict(sorted({median: "median duration", longest: "longest"}.items()))


def resolve_detail_steps(windows: pl.DataFrame, spec: str | None) -> dict[int, str]:
    """The steps to draw in detail, each with its role in the title; ``spec`` as ``--steps``.

    None: :func:`default_detail_steps`. A step the run lacks, a spec matching none, or more
    than :data:`MAX_DETAIL_STEPS` steps is a one-line :class:`InputError`.
    """
    if not spec:
        return default_detail_steps(windows)
    try:
        parsed = parse_steps(spec)
    except InputError as exc:
        raise InputError(str(exc).replace("--steps", _OPTION, 1)) from exc
    available = windows["step"].to_list()
    have = f"steps available: {steps_text(available)}" if available else "the run has no steps"
    missing = [s for s in parsed.named() if s not in available]
    if missing:
        raise InputError(f"{_OPTION} {spec!r}: no step {steps_text(missing)} ({have})")
    chosen = parsed.picks(available)
    if not chosen:
        raise InputError(f"{_OPTION} {spec!r} matches no step of this run ({have})")
    if len(chosen) > MAX_DETAIL_STEPS:
        raise InputError(
            f"{_OPTION} {spec!r} chooses {len(chosen)} steps; the detail shows at most "
            f"{MAX_DETAIL_STEPS} (e.g. {steps_text(chosen[:2])})"
        )
    return {s: "chosen" for s in chosen}


def check_detail_steps(steps: pl.DataFrame, spec: str | None) -> None:
    """Fail early (before writing anything) when ``spec`` names steps the run lacks."""
    if spec:
        resolve_detail_steps(step_windows(steps), spec)


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
    """Per device and bin (``edges``: bin starts): ``t_ns`` (bin centre), mean, min, max power."""
    t = samples["t_ns"].to_numpy()
    index = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, len(edges) - 1)
    ends = np.append(edges[1:], max(int(t.max()), int(edges[-1])) + 1)
    centres = pl.DataFrame({"bin": np.arange(len(edges)), "t_ns": (edges + ends) // 2})
    return (
        samples.with_columns(bin=pl.Series(index, dtype=pl.Int64))
        .group_by("device", "bin")
        .agg(
            pl.col("power_w").mean().alias("mean"),
            pl.col("power_w").min().alias("min"),
            pl.col("power_w").max().alias("max"),
        )
        .join(centres, on="bin")
        .sort("device", "bin")
    )


def _time_unit(span_ns: float) -> tuple[float, str]:
    """Hours for a run over 2 h, seconds over 2 s, else milliseconds."""
    units = ((3600e9, "h"), (1e9, "s"))
    return next(((f, u) for f, u in units if span_ns >= 2 * f), (1e6, "ms"))


def _ribbon(ax: Axes, bands: pl.DataFrame, order: list[str], factor: float, t0: int = 0) -> None:
    """The phase ribbon: one ``broken_barh`` per phase, at full colour."""
    for name in order:
        rows = bands.filter(pl.col("canonical") == name)
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


def _order(bands: pl.DataFrame) -> list[str]:
    """Phase names in execution order (first start)."""
    first = bands.group_by("canonical").agg(pl.col("start_ns").min()).sort("start_ns", "canonical")
    return first["canonical"].to_list()


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


def _overview_lines(
    ax: Axes, samples: pl.DataFrame, phases: pl.DataFrame, factor: float
) -> list[Any]:
    """One line per GPU; past :data:`MAX_POINTS` samples per GPU, per-bin means (handles).

    Binned, one light grey band behind the lines spans the samples' min–max over all GPUs (one
    band per GPU would cover the lines with overlapping colour).
    """
    devices = sorted(samples["device"].unique().to_list())
    if len(devices) > MAX_GPU_LINES:
        return _median_line(ax, samples, phases, factor)
    dense = int_value(samples.group_by("device").len()["len"].max() or 0) > MAX_POINTS
    handles: list[Any] = []
    if dense:
        edges, per = bin_edges(samples, phases, BINS)
        data = binned_power(samples, edges)
        span = data.group_by("t_ns").agg(pl.col("min").min(), pl.col("max").max()).sort("t_ns")
        band = ax.fill_between(
            (span["t_ns"] / factor).to_numpy(),
            span["min"].to_numpy(),
            span["max"].to_numpy(),
            color="#bbbbbb",
            alpha=0.35,
            lw=0,
            label=f"min–max, all GPUs\n(lines: mean per {per})",
        )
        handles.append(band)
    else:
        data = samples.select("device", "t_ns", mean="power_w")
    for k, device in enumerate(devices):
        rows = data.filter(pl.col("device") == device).sort("t_ns")
        (line,) = ax.plot(
            (rows["t_ns"] / factor).to_numpy(),
            rows["mean"].to_numpy(),
            color=_GPU_COLORS[k % len(_GPU_COLORS)],
            lw=0.9,
            label=device_label(device),
        )
        handles.insert(k, line)
    return handles


def _median_line(ax: Axes, samples: pl.DataFrame, phases: pl.DataFrame, factor: float) -> list[Any]:
    """Past :data:`MAX_GPU_LINES` GPUs: per bin, the median of the GPUs' means, p10–p90 band."""
    n = samples["device"].n_unique()
    per = (
        binned_power(samples, bin_edges(samples, phases, BINS)[0])
        .group_by("t_ns")
        .agg(pl.col("mean").quantile(q, "linear").alias(str(q)) for q in (0.1, 0.5, 0.9))
        .sort("t_ns")
    )
    x = (per["t_ns"] / factor).to_numpy()
    band = ax.fill_between(
        x,
        per["0.1"].to_numpy(),
        per["0.9"].to_numpy(),
        color="#1f77b4",
        alpha=0.2,
        lw=0,
        label="p10–p90 over GPUs",
    )
    (line,) = ax.plot(
        x, per["0.5"].to_numpy(), color="#1f77b4", lw=0.8, label=f"median of {n} GPUs"
    )
    return [line, band]


def overview_figure(phases: pl.DataFrame, samples: pl.DataFrame) -> Figure:
    """The ``power_timeline`` figure (not saved): ribbon above, GPU lines below."""
    bands = driver_phases(phases)
    order = _order(bands)
    devices = sorted(samples["device"].unique().to_list())
    t1 = max(
        int_value(samples["t_ns"].max() or 0),
        int_value(bands["end_ns"].max() or 0) if bands.height else 0,
    )
    factor, unit = _time_unit(t1)
    fig, (top, ax) = plt.subplots(
        2, 1, figsize=CANVAS, sharex=True, gridspec_kw={"height_ratios": (1, 14), "hspace": 0.04}
    )
    _ribbon(top, bands, order, factor)
    handles = _overview_lines(ax, samples, phases, factor)
    ax.set_xlim(0, t1 / factor)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time ({unit}, run clock)")
    ax.set_ylabel("power (W)")
    n_steps = bands["step"].n_unique() if bands.height else 0
    top.set_title(f"GPU power over the run ({n_steps} steps, {len(devices)} GPUs)", fontsize=10)
    _legends(fig, ax, handles, order)
    fig.subplots_adjust(left=0.08, right=0.78, top=0.92, bottom=0.12)
    return fig


def power_timeline(phases: pl.DataFrame, samples: pl.DataFrame | None, out: Path) -> list[Path]:
    """Power per GPU over the whole run, under a ribbon of the driver phases (see the module)."""
    if samples is None or samples.is_empty():
        return []
    return save_figure(overview_figure(phases, samples), out, "power_timeline")


def _detail_panel(
    top: Axes, ax: Axes, window: tuple[int, int], bands: pl.DataFrame, samples: pl.DataFrame
) -> list[Any]:
    """One step: ribbon, phase bands and sample-level lines per GPU, ms since step start."""
    start, end = window
    inside = bands.filter((pl.col("end_ns") > start) & (pl.col("start_ns") < end))
    _ribbon(top, inside, _order(inside), 1e6, start)
    for name, s, e in inside.select("canonical", "start_ns", "end_ns").iter_rows():
        ax.axvspan((s - start) / 1e6, (e - start) / 1e6, color=phase_hex(name), alpha=0.22, lw=0)
    # one sample either side, so the line reaches the step's edges
    t = pl.col("t_ns")
    margin = max(end - start, 2_000_000_000)  # wider than any sampling interval
    near = samples.filter(t.is_between(start - margin, end + margin))
    handles = []
    for k, device in enumerate(sorted(samples["device"].unique().to_list())):
        rows = near.filter(pl.col("device") == device).sort("t_ns")
        lo = rows.filter(t < start).tail(1)
        hi = rows.filter(t > end).head(1)
        rows = pl.concat([lo, rows.filter((t >= start) & (t <= end)), hi])
        x = ((rows["t_ns"] - start) / 1e6).to_numpy()
        color = _GPU_COLORS[k % len(_GPU_COLORS)]
        label = device_label(device)
        (line,) = ax.plot(x, rows["power_w"].to_numpy(), color=color, lw=0.9, label=label)
        handles.append(line)
    ax.set_xlim(0, (end - start) / 1e6)
    return handles


def detail_figure(
    phases: pl.DataFrame, samples: pl.DataFrame, steps: pl.DataFrame, chosen: dict[int, str]
) -> Figure:
    """The ``power_timeline_detail`` figure (not saved): one panel per chosen step."""
    bands = driver_phases(phases)
    windows = {r[0]: (r[1], r[2]) for r in step_windows(steps).iter_rows()}
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
        handles = _detail_panel(top, ax, windows[step], bands, samples)
        dur = (windows[step][1] - windows[step][0]) / 1e6
        role_text = "" if role == "chosen" else f", {role}"
        top.set_title(f"step {step} ({dur:,.0f} ms{role_text})", fontsize=8)
        ax.set_xlabel("time in step (ms)", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[1, 0].set_ylabel("power (W)")
    axes[1, 0].set_ylim(bottom=0)
    fig.suptitle(
        f"GPU power within step{'s' if n > 1 else ''} {', '.join(map(str, chosen))}", fontsize=10
    )
    _legends(fig, axes[1, -1], handles, _order(bands))
    fig.subplots_adjust(left=0.08, right=0.78, top=0.86, bottom=0.12)
    return fig


def power_timeline_detail(
    phases: pl.DataFrame,
    samples: pl.DataFrame | None,
    steps: pl.DataFrame,
    out: Path,
    detail_steps: str | None = None,
) -> list[Path]:
    """Power per GPU within a few steps (``detail_steps``, as ``--steps``; default: see the module)."""
    if samples is None or samples.is_empty():
        return []
    chosen = resolve_detail_steps(step_windows(steps), detail_steps)
    if not chosen:
        return []
    fig = detail_figure(phases, samples, steps, chosen)
    return save_figure(fig, out, "power_timeline_detail")
