"""The power envelope (:mod:`analysis.energy.envelope`) as ``power_envelope.csv`` and a figure.

Nothing here computes: the table is written as it is (floats to 3 decimals), and the figure
draws its columns. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from analysis.render.files import atomic_write

if TYPE_CHECKING:
    from matplotlib.axes import Axes

CSV_NAME = "power_envelope.csv"
FIGURE_STEM = "power_envelope"
#: the canvas (inches) with node panels, and with the GPU panel alone, whatever the GPUs and phases
CANVAS = (8.0, 7.0)
CANVAS_GPU_ONLY = (8.0, 4.0)
#: beyond this many GPUs the GPU panel draws their median (and range), not one mark per GPU
MAX_GPU_MARKS = 8
#: beyond this many phases the node panel leaves out its energy-share labels (they would overlap)
MAX_SHARE_LABELS = 16
_LEGEND: dict[str, Any] = {
    "loc": "upper left",
    "bbox_to_anchor": (1.01, 1.0),
    "frameon": False,
    "fontsize": 7,
}


def write_envelope_csv(envelope: pl.DataFrame, out: str | Path) -> list[Path]:
    """Write ``out/power_envelope.csv`` (atomically); nothing for an empty table."""
    if envelope.is_empty():
        return []
    return [atomic_write(Path(out) / CSV_NAME, lambda p: envelope.write_csv(p, float_precision=3))]


def _label(path: str) -> str:
    name = path.removeprefix("step/")
    return name if len(name) <= 22 else f"{name[:10]}…{name[-11:]}"


def _marks(
    ax: Axes, x: list[float], p50: list[Any], p95: list[Any], top: list[Any], **kw: Any
) -> None:
    """A line from p50 to max, p50 dot, p95 tick, max triangle at each ``x``."""
    color = kw.pop("color")
    ax.vlines(x, p50, top, color=color, lw=1)
    ax.plot(x, p50, "o", color=color, ms=4, **kw)
    ax.plot(x, p95, "_", color=color, ms=8)
    ax.plot(x, top, "^", color=color, ms=4)


def _gpu_panel(ax: Axes, gpus: pl.DataFrame, paths: list[str]) -> None:
    """Per GPU and phase: p50 dot, p95 tick, max triangle; past MAX_GPU_MARKS, over the GPUs."""
    from matplotlib.lines import Line2D

    from analysis.normalize.devices import device_label

    devices = sorted(gpus["device"].unique().to_list())
    if len(devices) > MAX_GPU_MARKS:
        stats = gpus.group_by("path").agg(
            pl.col("p50_w").median(),
            pl.col("p95_w").median(),
            pl.col("max_w").median().alias("max_med"),
            pl.col("p50_w").min().alias("lowest"),
            pl.col("max_w").max().alias("highest"),
        )
        rows = {r["path"]: r for r in stats.iter_rows(named=True)}
        x = [float(i) for i, p in enumerate(paths) if p in rows]
        got = [rows[p] for p in paths if p in rows]
        ax.vlines(x, [r["lowest"] for r in got], [r["highest"] for r in got], color="#bbbbbb", lw=3)
        _marks(
            ax, x, *([r[c] for r in got] for c in ("p50_w", "p95_w", "max_med")), color="#333333"
        )
        ax.legend(
            handles=[
                Line2D(
                    [],
                    [],
                    color="#333333",
                    marker="o",
                    ls="",
                    label=f"median of {len(devices)} GPUs",
                ),
                Line2D([], [], color="#bbbbbb", lw=3, label="lowest p50 to\nhighest max"),
            ],
            **_LEGEND,
        )
    else:
        width = 0.8 / max(len(devices), 1)
        for k, device in enumerate(devices):
            values = {
                r["path"]: r for r in gpus.filter(pl.col("device") == device).iter_rows(named=True)
            }
            x = [i - 0.4 + width * (k + 0.5) for i, p in enumerate(paths) if p in values]
            got = [values[p] for p in paths if p in values]
            cols = ([r[c] for r in got] for c in ("p50_w", "p95_w", "max_w"))
            _marks(ax, x, *cols, color=f"C{k % 10}", label=device_label(device))
        ax.legend(**_LEGEND)
    ax.set_ylim(0, 1.1 * float(gpus.select(pl.col("max_w").max()).item() or 1.0))
    ax.set_ylabel("GPU power (W)")
    ax.set_title("Per GPU: p50 dot, p95 tick, max triangle", fontsize=9)


def _node_panels(power: Axes, ramp: Axes, nodes: pl.DataFrame, paths: list[str]) -> None:
    """Per node and phase: p50 bar with p95/max marks and energy share; ramp at phase start.

    Bars take the phase's NVTX colour (as in every figure); several nodes differ by hatch.
    """
    from matplotlib.patches import Patch

    from analysis.render.figures import HATCHES, phase_hex

    hosts = sorted(nodes["host"].unique().to_list())
    width = 0.8 / max(len(hosts), 1)
    for k, host in enumerate(hosts):
        values = {r["path"]: r for r in nodes.filter(pl.col("host") == host).iter_rows(named=True)}
        x = [i - 0.4 + width * (k + 0.5) for i, p in enumerate(paths) if p in values]
        got = [values[p] for p in paths if p in values]
        style: dict[str, Any] = {
            "color": [phase_hex(r["path"].rsplit("/", 1)[-1]) for r in got],
            "alpha": 0.75,
            "hatch": HATCHES[k % len(HATCHES)],
            "edgecolor": "#333333",
            "linewidth": 0.4,
        }
        p50 = [r["p50_w"] or 0.0 for r in got]
        power.bar(x, p50, width * 0.9, **style)
        power.vlines(x, p50, [r["max_w"] or 0.0 for r in got], color="#333333", lw=1)
        power.plot(x, [r["p95_w"] for r in got], "_", color="#333333", ms=10)
        power.plot(x, [r["max_w"] for r in got], "^", color="#333333", ms=4)
        for xi, r in zip(x, got, strict=True):
            if len(paths) > MAX_SHARE_LABELS:
                break
            if r["energy_share_pct"] is not None and r["max_w"] is not None:
                power.annotate(
                    f"{r['energy_share_pct']:.1f}%",
                    (xi, r["max_w"]),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=6,
                )
        ramp.bar(x, [r["ramp_w_per_ms"] or 0.0 for r in got], width * 0.9, **style)
        ramp.plot(x, [r["ramp_max_w_per_ms"] for r in got], "D", color="#333333", ms=3)
    if len(hosts) > 1:
        handles = [
            Patch(
                facecolor="white",
                edgecolor="#333333",
                hatch=HATCHES[k % len(HATCHES)],
                label=f"node {host}",
            )
            for k, host in enumerate(hosts)
        ]
        power.legend(handles=handles, **_LEGEND)
    power.set_ylim(
        0, 1.2 * float(nodes.select(pl.col("max_w").max()).item() or 1.0)
    )  # room for the labels
    power.set_ylabel("node power (W)")
    power.set_title(
        "Per node (sum of its GPUs): p50 bar, p95 tick, max triangle"
        + ("; label: % of run energy" if len(paths) <= MAX_SHARE_LABELS else ""),
        fontsize=9,
    )
    windows = nodes["ramp_window_ms"].drop_nulls().unique().sort().to_list()
    window = "/".join(f"{float(w):.3g}" for w in windows) or "?"
    ramp.axhline(0, color="#999999", lw=0.6)
    ramp.set_ylabel("power ramp (W/ms)")
    ramp.set_title(
        f"Node ramp at phase start (mean {window} ms after − before): median bar, steepest diamond",
        fontsize=9,
    )


def power_envelope_figure(envelope: pl.DataFrame, out: str | Path) -> list[Path]:
    """``figures/power_envelope.png/svg``: the envelope per GPU, per node, and node ramps."""
    if envelope.is_empty() or envelope["p50_w"].is_null().all():
        return []
    import matplotlib.pyplot as plt

    from analysis.render.figures import save_figure  # sets the headless backend

    paths = list(dict.fromkeys(envelope["path"].to_list()))  # the table's order: first start
    gpus = envelope.filter(pl.col("scope") == "gpu")
    nodes = envelope.filter(pl.col("scope") == "node")
    n_panels = 3 if not nodes.is_empty() else 1
    fig, axes = plt.subplots(
        n_panels, 1, figsize=CANVAS if n_panels == 3 else CANVAS_GPU_ONLY, sharex=True
    )
    axes = list(axes) if n_panels > 1 else [axes]
    _gpu_panel(axes[0], gpus, paths)
    if n_panels == 3:
        _node_panels(axes[1], axes[2], nodes, paths)
    for ax in axes:
        ax.grid(axis="y", color="#eeeeee", lw=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="y", labelsize=8)
    axes[-1].set_xticks(
        range(len(paths)),
        [_label(p) for p in paths],
        rotation=30,
        ha="right",
        rotation_mode="anchor",
        fontsize=8 if len(paths) <= 10 else 6,
    )
    axes[-1].set_xlim(-0.6, len(paths) - 0.4)
    axes[-1].set_xlabel("phase (in execution order)", fontsize=8)
    source = ", ".join(sorted(set(envelope["power_from"].drop_nulls().to_list())))
    fig.suptitle(f"Power envelope per phase (all steps; power from {source})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, Path(out), FIGURE_STEM)
