"""The phase table in the terminal (rich)."""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.table import Table
from rich.text import Text

from analysis.model import Analysis


def _ms(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e6:,.2f}"


def phase_rich_table(analysis: Analysis, *, max_rows: int = 60) -> Table:
    """Per step and phase: wall time, GPU busy share and where GPU time went."""
    n_devices = analysis.summary.n_devices
    has_energy = analysis.phases["energy_j"].null_count() < analysis.phases.height
    table = Table(
        title=f"Phases per step ({analysis.summary.n_steps} steps, {n_devices} GPU(s))",
        caption="window: driver-side phase, GPU work of all devices inside it; "
        "projection: work launched inside the range (NVIDIA's definition)",
        header_style="bold",
    )
    for name, justify in [
        ("step", "right"),
        ("pid", "right"),
        ("phase", "left"),
        ("attr", "left"),
        ("wall ms", "right"),
        ("busy %", "right"),
        ("idle ms", "right"),
        ("kernel ms", "right"),
        ("NCCL ms", "right"),
        ("memcpy ms", "right"),
        ("memcpy MB", "right"),
        ("kernels", "right"),
        *([("energy J", "right"), ("avg W", "right")] if has_energy else []),
    ]:
        table.add_column(name, justify=justify, no_wrap=name == "phase")  # type: ignore[arg-type]
    rows = analysis.phases.with_columns(
        pl.when(pl.col("wall_ns") * pl.col("n_devices") > 0)
        .then(100 * pl.col("gpu_busy_ns") / (pl.col("wall_ns") * pl.col("n_devices")))
        .alias("busy_pct")
    )
    for row in rows.head(max_rows).iter_rows(named=True):
        indent = "  " * int(row["level"] or 0)
        table.add_row(
            "" if row["step"] is None else str(row["step"]),
            str(row["pid"]),
            Text(indent + row["path"].rsplit("/", 1)[-1]),  # Text: names are never markup
            row["attribution"][:4],
            _ms(row["wall_ns"]),
            "" if row["busy_pct"] is None else f"{row['busy_pct']:.0f}",
            _ms(row["idle_ns"]),
            _ms(row["kernel_ns"]),
            _ms(row["nccl_ns"]),
            _ms(row["memcpy_ns"]),
            f"{row['memcpy_bytes'] / 1e6:,.1f}",
            str(row["n_kernels"]),
            *(
                [
                    "" if row["energy_j"] is None else f"{row['energy_j']:,.3f}",
                    "" if row["avg_power_w"] is None else f"{row['avg_power_w']:,.0f}",
                ]
                if has_energy
                else []
            ),
        )
    if rows.height > max_rows:
        more = Text(f"{rows.height - max_rows} more rows in phases.csv")
        table.add_row("…", "", more, *[""] * (len(table.columns) - 3))
    return table


def print_report(analysis: Analysis, console: Console, *, max_rows: int = 60) -> None:
    """Print the phase table, the conservation line and any warnings."""
    console.print(phase_rich_table(analysis, max_rows=max_rows))
    gpu, energy = analysis.summary.gpu, analysis.summary.energy
    if gpu.total_gpu_ns:
        console.print(
            f"GPU time {_ms(gpu.total_gpu_ns)} ms in {gpu.n_gpu_ops:,} operations; "
            f"window: {_ms(gpu.attributed_gpu_ns)} ms attributed + "
            f"{_ms(gpu.unattributed_gpu_ns)} ms unattributed; projection: "
            f"{_ms(gpu.projection_attributed_gpu_ns)} + {_ms(gpu.projection_unattributed_gpu_ns)} ms"
        )
    else:
        console.print("No GPU activity in these traces (CPU-only capture): wall times only.")
    if energy is not None:
        console.print(
            f"GPU energy {energy.total_energy_j:,.3f} J ({energy.power_source}): "
            f"{energy.attributed_energy_j:,.3f} J in phases + "
            f"{energy.unattributed_energy_j:,.3f} J unattributed"
        )
    for warning in analysis.warnings:
        console.print(Text("warning: " + warning, style="yellow"))
