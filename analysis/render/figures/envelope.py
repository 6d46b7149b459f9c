"""The power envelope (:mod:`analysis.energy.envelope`) as ``power_envelope.csv`` and a figure.

Nothing here computes: the table is written as it is (floats to 3 decimals), and the figure
draws its columns. matplotlib is imported only when drawing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from ...frames import int_value
from ..report.units import fixed

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


def envelope_figure_data(envelope: pl.DataFrame) -> pl.DataFrame:
    """What ``power_envelope`` draws, one row per mark group (``figures/power_envelope.csv``).

    ``panel`` ``gpu`` (per GPU ``device`` and ``path``: ``p50_w``, ``p95_w``, ``max_w``) or,
    past :data:`MAX_GPU_MARKS` GPUs, ``gpus`` (per path over ``n_gpus`` GPUs: the median of
    each, ``lowest_p50_w``, ``highest_max_w``); ``node`` (per ``host`` and path: the bar
    ``p50_w``, ``p95_w``, ``max_w``, ``energy_share_pct`` of the run's energy, ``ramp_w_per_ms``
    bar and ``ramp_max_w_per_ms``). Paths in the table's order.
    """
    order = pl.DataFrame({"path": list(dict.fromkeys(envelope["path"].to_list()))})
    order = order.with_row_index("order")
    gpus = envelope.filter(pl.col("scope") == "gpu").join(order, on="path")
    watts = ("p50_w", "p95_w", "max_w")
    if gpus["device"].n_unique() > MAX_GPU_MARKS:
        gpu_rows = gpus.group_by("order", "path").agg(
            pl.lit("gpus").alias("panel"),
            pl.len().cast(pl.Int64).alias("n_gpus"),
            *(pl.col(c).median() for c in watts),
            pl.col("p50_w").min().alias("lowest_p50_w"),
            pl.col("max_w").max().alias("highest_max_w"),
        )
    else:
        gpu_rows = gpus.select("order", "path", "device", *watts, panel=pl.lit("gpu"))
    node_columns = (*watts, "energy_share_pct", "ramp_w_per_ms", "ramp_max_w_per_ms")
    nodes = envelope.filter(pl.col("scope") == "node").join(order, on="path")
    node_rows = nodes.select("order", "path", "host", *node_columns, panel=pl.lit("node"))
    types: dict[str, pl.DataType] = dict.fromkeys(("panel", "path", "device", "host"), pl.String())
    types["n_gpus"] = pl.Int64()
    types |= dict.fromkeys(
        (*watts, "lowest_p50_w", "highest_max_w", *node_columns[3:]), pl.Float64()
    )
    rows = pl.concat([gpu_rows, node_rows], how="diagonal_relaxed")
    keys = [c for c in ("panel", "order", "device", "host") if c in rows.columns]
    rows = rows.sort(keys, nulls_last=True)
    return rows.select(
        (pl.col(c) if c in rows.columns else pl.lit(None)).cast(t).alias(c)
        for c, t in types.items()
    )


def _column(rows: list[dict[str, Any]], name: str) -> list[float]:
    """``name`` of each row, NaN where null (nothing is drawn there, not 0)."""
    return [float("nan") if r[name] is None else r[name] for r in rows]


def _gpu_panel(ax: Axes, data: pl.DataFrame, paths: list[str]) -> None:
    """Per GPU and phase: p50 dot, p95 tick, max triangle; past MAX_GPU_MARKS, over the GPUs."""
    from matplotlib.lines import Line2D

    from ...normalize.devices import device_label

    where = {p: i for i, p in enumerate(paths)}
    if not data.is_empty() and data["panel"][0] == "gpus":
        got = data.to_dicts()
        x = [float(where[r["path"]]) for r in got]
        low, high = _column(got, "lowest_p50_w"), _column(got, "highest_max_w")
        ax.vlines(x, low, high, color="#bbbbbb", lw=3)
        _marks(ax, x, *(_column(got, c) for c in ("p50_w", "p95_w", "max_w")), color="#333333")
        n = int_value(data["n_gpus"].max())
        ax.legend(
            handles=[
                Line2D([], [], color="#333333", marker="o", ls="", label=f"median of {n} GPUs"),
                Line2D([], [], color="#bbbbbb", lw=3, label="lowest p50 to\nhighest max"),
            ],
            **_LEGEND,
        )
    else:
        devices = sorted(data["device"].unique().to_list())
        width = 0.8 / max(len(devices), 1)
        for k, device in enumerate(devices):
            got = data.filter(pl.col("device") == device).to_dicts()
            x = [where[r["path"]] - 0.4 + width * (k + 0.5) for r in got]
            cols = (_column(got, c) for c in ("p50_w", "p95_w", "max_w"))
            _marks(ax, x, *cols, color=f"C{k % 10}", label=device_label(device))
        ax.legend(**_LEGEND)
    ax.set_ylim(0, 1.1 * float(data.select(pl.col("max_w").max()).item() or 1.0))
    ax.set_ylabel("GPU power (W)")
    ax.set_title("Per GPU: p50 dot, p95 tick, max triangle", fontsize=9)


def _node_panels(power: Axes, ramp: Axes, nodes: pl.DataFrame, paths: list[str]) -> None:
    """Per node and phase: p50 bar with p95/max marks and energy share; ramp at phase start.

    Bars take the phase's NVTX colour (as in every figure); several nodes differ by hatch.
    ``nodes``: the ``node`` rows of :func:`envelope_figure_data`.
    """
    from matplotlib.patches import Patch

    from .phases import HATCHES, phase_hex

    hosts = sorted(nodes["host"].unique().to_list())
    width = 0.8 / max(len(hosts), 1)
    where = {p: i for i, p in enumerate(paths)}
    for k, host in enumerate(hosts):
        got = nodes.filter(pl.col("host") == host).to_dicts()
        x = [where[r["path"]] - 0.4 + width * (k + 0.5) for r in got]
        style: dict[str, Any] = {
            "color": [phase_hex(r["path"].rsplit("/", 1)[-1]) for r in got],
            "alpha": 0.75,
            "hatch": HATCHES[k % len(HATCHES)],
            "edgecolor": "#333333",
            "linewidth": 0.4,
        }
        p50, top = _column(got, "p50_w"), _column(got, "max_w")
        power.bar(x, p50, width * 0.9, **style)
        power.vlines(x, p50, top, color="#333333", lw=1)
        power.plot(x, _column(got, "p95_w"), "_", color="#333333", ms=10)
        power.plot(x, top, "^", color="#333333", ms=4)
        for xi, r in zip(x, got, strict=True):
            if len(paths) > MAX_SHARE_LABELS:
                break
            if r["energy_share_pct"] is not None and r["max_w"] is not None:
                power.annotate(
                    f"{fixed(r['energy_share_pct'], 1, pct=True)}%",
                    (xi, r["max_w"]),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=6,
                )
        ramp.bar(x, _column(got, "ramp_w_per_ms"), width * 0.9, **style)
        ramp.plot(x, _column(got, "ramp_max_w_per_ms"), "D", color="#333333", ms=3)
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
    ramp.axhline(0, color="#999999", lw=0.6)
    ramp.set_ylabel("power ramp (W/ms)")


def power_envelope_figure(envelope: pl.DataFrame, out: str | Path) -> list[Path]:
    """``figures/power_envelope.png/svg``: the envelope per GPU, per node, and node ramps.

    Its numbers (:func:`envelope_figure_data`) go to ``figures/power_envelope.csv``.
    """
    if envelope.is_empty() or envelope["p50_w"].is_null().all():
        return []
    import matplotlib.pyplot as plt

    from .phases import save_figure  # sets the headless backend

    paths = list(dict.fromkeys(envelope["path"].to_list()))  # the table's order: first start
    data = envelope_figure_data(envelope)
    nodes = data.filter(pl.col("panel") == "node")
    n_panels = 3 if not nodes.is_empty() else 1
    fig, axes = plt.subplots(
        n_panels, 1, figsize=CANVAS if n_panels == 3 else CANVAS_GPU_ONLY, sharex=True
    )
    axes = list(axes) if n_panels > 1 else [axes]
    _gpu_panel(axes[0], data.filter(pl.col("panel") != "node"), paths)
    if n_panels == 3:
        _node_panels(axes[1], axes[2], nodes, paths)
        windows = envelope["ramp_window_ms"].drop_nulls().unique().sort().to_list()
        window = "/".join(f"{float(w):.3g}" for w in windows) or "?"
        axes[2].set_title(
            f"Node ramp at phase start (mean {window} ms after − before): median bar, "
            "steepest diamond",
            fontsize=9,
        )
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
    return save_figure(fig, Path(out), FIGURE_STEM, data=data)
