"""Figures of an asynchronous run's GPU pools: idle GPU time by cause, per pool."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import polars as pl

from ...attribute.idle_causes import CAUSES, idle_totals
from .phases import save_figure

#: one colour per cause (colour-blind safe; ``other``/``no_phase`` greys)
CAUSE_COLORS: dict[str, str] = {
    "starvation": "#d55e00",
    "refit": "#0072b2",
    "partial_rollout_pause": "#cc79a7",
    "generation_limit": "#e69f00",
    "validation": "#009e73",
    "other": "#999999",
    "no_phase": "#dddddd",
}


def idle_by_cause_figure(idle_causes: pl.DataFrame, out: Path) -> list[Path]:
    """One horizontal bar per pool: its idle GPU time (GPU-seconds) stacked by cause."""
    data = idle_totals(idle_causes)
    if data.is_empty() or data["idle_ns"].sum() <= 0:
        return []
    pools = sorted(set(data["pool"].to_list()))
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(pools)))
    left = dict.fromkeys(pools, 0.0)
    for cause in CAUSES:
        rows = data.filter(pl.col("cause") == cause)
        if rows.is_empty():
            continue
        seconds = dict(zip(rows["pool"], (rows["idle_ns"] / 1e9).to_list(), strict=True))
        widths = [max(seconds.get(p, 0.0), 0.0) for p in pools]
        ax.barh(
            pools,
            widths,
            left=[left[p] for p in pools],
            color=CAUSE_COLORS[cause],
            edgecolor="white",
            linewidth=0.5,
            label=cause.replace("_", " "),
        )
        for pool, width in zip(pools, widths, strict=True):
            left[pool] += width
    ax.set_xlabel("idle GPU time, all GPUs of the pool (GPU-seconds)")
    ax.set_title("Idle GPU time by cause, per pool")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "idle_by_cause", data=data)
