"""The phase table in the terminal (rich).

Rows are grouped by process: the driver's phases (window scheme: the GPU work of every device
inside each phase) first, then each worker's ranges (projection scheme: the work it launched),
each group under a header row naming the process, its role and its scheme; within a group,
steps in order. Where no GPU is in a row's scope (a CPU-only capture, a range that launched
nothing), every GPU column shows "—" and the caption says why, once.
"""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.table import Table
from rich.text import Text

from analysis.model import PROJECTION, WINDOW, Analysis

#: what a GPU column shows where no GPU is in the row's scope
NO_GPU = "—"
#: fewest rows a process gets in the table (its first step, at least) before the rest are cut
MIN_GROUP_ROWS = 4


def _ms(ns: float | None) -> str:
    return "" if ns is None else f"{ns / 1e6:,.2f}"


def _groups(phases: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace, pid, attribution) in display order: window (drivers) first."""
    return (
        phases.group_by("trace", "pid", "attribution")
        .agg(pl.len().alias("n_rows"), pl.col("start_ns").min())
        .with_columns((pl.col("attribution") != WINDOW).alias("_worker"))
        .sort("_worker", "trace", "pid", "attribution")
    )


def _group_title(group: dict, n_traces: int, has_workers: bool) -> str:
    """``driver · pid 1000 · window`` (the trace named when there are several)."""
    if group["attribution"] == PROJECTION:
        role = "worker"
    else:
        role = "driver" if has_workers else "process"
    where = f"{group['trace']} " if n_traces > 1 else ""
    return f"{role} · {where}pid {group['pid']} · {group['attribution']}"


def _columns(has_energy: bool) -> list[tuple[str, str]]:
    return [
        ("step", "right"),
        ("phase", "left"),
        ("wall ms", "right"),
        ("GPU busy %", "right"),
        ("GPU idle ms", "right"),
        ("kernel ms", "right"),
        ("NCCL ms", "right"),
        ("memcpy ms", "right"),
        ("memcpy MB", "right"),
        ("kernels", "right"),
        *([("energy J", "right"), ("avg W", "right")] if has_energy else []),
    ]


def _cells(row: dict, has_energy: bool) -> list[str | Text]:
    """One phase row's cells; "—" in every GPU column when no GPU is in its scope."""
    indent = "  " * int(row["level"] or 0)
    name = Text(indent + row["path"].rsplit("/", 1)[-1])  # Text: names are never markup
    step = "" if row["step"] is None else str(row["step"])
    if not row["n_devices"]:
        gpu: list[str] = [NO_GPU] * (7 + 2 * has_energy)
    else:
        gpu = [
            "" if row["busy_pct"] is None else f"{row['busy_pct']:.0f}",
            _ms(row["idle_ns"]),
            _ms(row["kernel_ns"]),
            _ms(row["nccl_ns"]),
            _ms(row["memcpy_ns"]),
            f"{row['memcpy_bytes'] / 1e6:,.1f}",
            str(row["n_kernels"]),
        ]
        if has_energy:
            gpu += [
                NO_GPU if row["energy_j"] is None else f"{row['energy_j']:,.3f}",
                NO_GPU if row["avg_power_w"] is None else f"{row['avg_power_w']:,.0f}",
            ]
    return [step, name, _ms(row["wall_ns"]), *gpu[: 7 + 2 * has_energy]]


def _caption(analysis: Analysis, no_gpu_rows: bool) -> str:
    schemes = set(analysis.phases["attribution"].unique())
    lines = [
        text
        for scheme, text in (
            (WINDOW, "window: a driver's phases, the GPU work of all devices inside each"),
            (PROJECTION, "projection: a worker's ranges, the GPU work launched inside them"),
        )
        if scheme in schemes
    ]
    if analysis.summary.gpu.total_gpu_ns == 0:
        lines.append(
            f"{NO_GPU}: No GPU activity in these traces (CPU-only capture): wall times only"
        )
    elif no_gpu_rows:
        lines.append(f"{NO_GPU}: no GPU in the row's scope (the range launched no GPU work)")
    return "\n".join(lines)


def phase_rich_table(analysis: Analysis, *, max_rows: int = 60) -> Table:
    """Per process (driver first, then workers), step and phase: wall time and GPU work."""
    phases = analysis.phases
    has_energy = phases["energy_j"].null_count() < phases.height
    rows = phases.with_columns(
        pl.when(pl.col("wall_ns") * pl.col("n_devices") > 0)
        .then(100 * pl.col("gpu_busy_ns") / (pl.col("wall_ns") * pl.col("n_devices")))
        .alias("busy_pct")
    )
    table = Table(
        title=f"Phases per step ({analysis.summary.n_steps} steps, "
        f"{analysis.summary.n_devices} GPU(s))",
        caption=_caption(analysis, bool((phases["n_devices"] == 0).any())),
        header_style="bold",
    )
    columns = _columns(has_energy)
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name == "phase")  # type: ignore[arg-type]
    groups = _groups(rows)
    n_traces = groups["trace"].n_unique()
    has_workers = bool((groups["attribution"] == PROJECTION).any())
    # each process gets a share of max_rows (at least MIN_GROUP_ROWS): every role shows up
    quota = max(max_rows // max(groups.height, 1), MIN_GROUP_ROWS)
    shown = n_groups = 0
    for group in groups.iter_rows(named=True):
        take = min(quota, max_rows - shown, group["n_rows"])
        if take <= 0:
            break
        mine = rows.filter(
            (pl.col("trace") == group["trace"])
            & (pl.col("pid") == group["pid"])
            & (pl.col("attribution") == group["attribution"])
        ).sort("step", "start_ns", "level", nulls_last=True)
        if shown:
            table.add_section()
        title = Text(_group_title(group, n_traces, has_workers), style="bold cyan")
        table.add_row("", title, *[""] * (len(columns) - 2))
        for row in mine.head(take).iter_rows(named=True):
            table.add_row(*_cells(row, has_energy))
        shown += take
        if group["n_rows"] > take:
            more = Text(f"{group['n_rows'] - take} more rows in phases.csv")
            table.add_row("…", more, *[""] * (len(columns) - 2))
        n_groups += 1
    if n_groups < groups.height:
        table.add_section()
        hidden = groups.slice(n_groups)
        noun = "process" if hidden.height == 1 else "processes"
        more = Text(f"{hidden.height} more {noun} ({hidden['n_rows'].sum()} rows) in phases.csv")
        table.add_row("…", more, *[""] * (len(columns) - 2))
    return table


def print_report(analysis: Analysis, console: Console, *, max_rows: int = 60) -> None:
    """Print the phase table, the conservation line and any warnings.

    A CPU-only capture gets no conservation line: the table's caption says it has no GPU work.
    """
    console.print(phase_rich_table(analysis, max_rows=max_rows))
    gpu, energy = analysis.summary.gpu, analysis.summary.energy
    if gpu.total_gpu_ns:
        console.print(
            f"GPU time {_ms(gpu.total_gpu_ns)} ms in {gpu.n_gpu_ops:,} operations; "
            f"window: {_ms(gpu.attributed_gpu_ns)} ms attributed + "
            f"{_ms(gpu.unattributed_gpu_ns)} ms unattributed; projection: "
            f"{_ms(gpu.projection_attributed_gpu_ns)} + {_ms(gpu.projection_unattributed_gpu_ns)} ms"
        )
    if energy is not None:
        console.print(
            f"GPU energy {energy.total_energy_j:,.3f} J ({energy.power_source}): "
            f"{energy.attributed_energy_j:,.3f} J in phases + "
            f"{energy.unattributed_energy_j:,.3f} J unattributed"
        )
    for warning in analysis.warnings:
        console.print(Text("warning: " + warning, style="yellow"))
