"""The phase table in the terminal (rich).

Rows are grouped by process: the driver's phases (window scheme: the GPU work of every device
inside each phase) first, then each worker's ranges (projection scheme: the work it launched),
each group under a header row naming the process and its role; within a group,
steps in order. The two schemes get a table each, because their GPU columns count different
things: a window phase's "GPU busy %"/"GPU idle ms" cover every device; a projection range's
busy share counts only what the range's own thread launched ("busy (own launches) %": PyTorch's
autograd thread, for one, launches backward kernels outside any range), so it is never called
GPU idle; "process GPU busy %"/"process GPU idle ms" (from ``process_gpu_busy_ns`` and
``process_idle_ns``, where the phase table has them) count every operation of the range's
process. A "graph ms" column (whole CUDA graph executions) shows where any phase has graph
time. Where no GPU is in a row's scope (a CPU-only capture, a range that launched nothing),
its GPU columns show "—" and the caption says why, once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import polars as pl
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from ..aggregate.steps import PROCESS_COLUMNS
from ..model import PROJECTION, WINDOW, Analysis
from .report.document import NO_STEPS, scheme_gpu_times, step_count
from .report.units import fixed

#: what a GPU column shows where no GPU is in the row's scope
NO_GPU = "—"
#: what a GPU column shows where the row's GPU work was not captured (never 0 % busy)
NOT_CAPTURED = "n/c"
#: fewest rows a process gets in the table (its first step, at least) before the rest are cut
MIN_GROUP_ROWS = 4
#: narrowest the phase column gets on a narrow console (longer names end in …)
MIN_PHASE_WIDTH = 8

Cell = Callable[[dict], str]


def _ms(ns: float | None) -> str:
    return "" if ns is None else fixed(ns / 1e6, 2)


def _pct(value: float | None) -> str:
    return NO_GPU if value is None else fixed(value, 0, pct=True)


@dataclass(frozen=True)
class _Column:
    """A GPU column: header, cell, and whether it is blank ("—") where the range used no GPU."""

    header: str
    cell: Cell
    own_gpu: bool = True


def _gpu_columns(scheme: str, graphs: bool, process: bool, energy: bool) -> list[_Column]:
    """The GPU columns of one scheme's table (see the module docstring)."""
    if scheme == WINDOW:
        busy = [
            _Column("GPU busy %", lambda r: _pct(r["busy_pct"])),
            _Column("GPU idle ms", lambda r: _ms(r["idle_ns"])),
        ]
    else:
        busy = [_Column("busy (own launches) %", lambda r: _pct(r["busy_pct"]))]
        if process:  # the process's work does not depend on what the range itself launched
            busy += [
                _Column("process GPU busy %", lambda r: _pct(r["process_busy_pct"]), False),
                _Column(
                    "process GPU idle ms",
                    lambda r: NO_GPU if r["process_idle_ns"] is None else _ms(r["process_idle_ns"]),
                    False,
                ),
            ]
    rest = [_Column("kernel ms", lambda r: _ms(r["kernel_ns"]))]
    rest += [_Column("graph ms", lambda r: _ms(r["graph_ns"]))] if graphs else []
    rest += [
        _Column("NCCL ms", lambda r: _ms(r["nccl_ns"])),
        _Column("memcpy ms", lambda r: _ms(r["memcpy_ns"])),
        _Column("memcpy MB", lambda r: f"{r['memcpy_bytes'] / 1e6:,.1f}"),
        _Column("kernels", lambda r: str(r["n_kernels"])),
    ]
    if energy:
        rest += [
            _Column("energy J", lambda r: _num(r["energy_j"], 3)),
            _Column("avg W", lambda r: _num(r["avg_power_w"], 0)),
        ]
    return busy + rest


def _num(value: float | None, digits: int) -> str:
    return NO_GPU if value is None else fixed(value, digits)


def _cells(row: dict, columns: list[_Column]) -> list[str | Text]:
    """One phase row's cells; "—" in its own GPU columns when no GPU is in its scope."""
    indent = "  " * int(row["level"] or 0)
    name = Text(indent + row["path"].rsplit("/", 1)[-1])  # Text: names are never markup
    step = "" if row["step"] is None else str(row["step"])
    if row.get("kernels_captured") is False:  # GPU work of the row's pool not captured
        gpu = [NOT_CAPTURED if c.own_gpu else c.cell(row) for c in columns]
    else:
        gpu = [NO_GPU if c.own_gpu and not row["n_devices"] else c.cell(row) for c in columns]
    return [step, name, _ms(row["wall_ns"]), *gpu]


def _groups(phases: pl.DataFrame) -> pl.DataFrame:
    """One row per (trace, pid, attribution) in display order: window (drivers) first."""
    pool = [pl.col("pool").drop_nulls().first()] if "pool" in phases.columns else []
    return (
        phases.group_by("trace", "pid", "attribution")
        .agg(pl.len().alias("n_rows"), pl.col("start_ns").min(), *pool)
        .with_columns((pl.col("attribution") != WINDOW).alias("_worker"))
        .sort("_worker", "trace", "pid", "attribution")
    )


def _group_title(group: dict, n_traces: int, has_workers: bool) -> str:
    """``driver · pid 1000`` (the trace named when there are several; the table names the scheme)."""
    if group["attribution"] == PROJECTION:
        role = "worker"
    else:
        role = "driver" if has_workers else "process"
    where = f"{group['trace']} " if n_traces > 1 else ""
    pool = f" · pool {group['pool']}" if group.get("pool") else ""
    return f"{role} · {where}pid {group['pid']}{pool}"


def _caption(analysis: Analysis, scheme: str, rows: pl.DataFrame, process: bool) -> str:
    if scheme == WINDOW and "pool" in rows.columns:
        lines = ["window: a driver's phases, the GPU work of its pool's GPUs inside each"]
    elif scheme == WINDOW:
        lines = ["window: a driver's phases, the GPU work of all devices inside each"]
    else:
        lines = [
            "projection: a worker's ranges, the GPU work launched inside them",
            "busy (own launches): only the work the range's own thread launched, not other "
            "threads' (e.g. autograd's backward): no measure of GPU idleness",
        ]
        lines.append(
            "process GPU busy/idle: every operation the range's process launched, on the GPUs "
            "it used"
            if process
            else "process GPU busy/idle: not in this analysis (no process_gpu_busy_ns column)"
        )
    if analysis.summary.gpu.total_gpu_ns == 0:
        lines.append(
            f"{NO_GPU}: No GPU activity in these traces (CPU-only capture): wall times only"
        )
    elif bool((rows["n_devices"] == 0).any()):
        lines.append(f"{NO_GPU}: no GPU in the row's scope (the range launched no GPU work)")
    if "kernels_captured" in rows.columns and not rows["kernels_captured"].fill_null(True).all():
        lines.append(
            f"{NOT_CAPTURED}: the pool's GPU work was not captured in this row (see the warning)"
        )
    return "\n".join(lines)


def _with_busy(phases: pl.DataFrame, process: bool) -> pl.DataFrame:
    """``busy_pct`` (the scheme's busy share), ``process_busy_pct``, ``process_idle_ns``."""
    capacity = pl.col("wall_ns") * pl.col("n_devices")
    rows = phases.with_columns(
        pl.when(capacity > 0).then(100 * pl.col("gpu_busy_ns") / capacity).alias("busy_pct")
    )
    if not process:
        return rows.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("process_busy_pct"),
            pl.lit(None, dtype=pl.Int64).alias("process_idle_ns"),
        )
    # process_idle_ns = wall × devices the process used − process busy: their sum is the capacity
    used = pl.col("process_gpu_busy_ns") + pl.col("process_idle_ns")
    return rows.with_columns(
        pl.when(used > 0).then(100 * pl.col("process_gpu_busy_ns") / used).alias("process_busy_pct")
    )


def phase_rich_tables(
    analysis: Analysis, *, max_rows: int = 60, width: int | None = None
) -> list[Table]:
    """Per scheme (driver phases, then worker ranges), process, step and phase: wall and GPU.

    ``width``: the console's, to fit the tables in (numbers are never cut; names may be).
    """
    phases = analysis.phases
    process = all(c in phases.columns for c in PROCESS_COLUMNS)
    rows = _with_busy(phases, process)
    has_energy = phases["energy_j"].null_count() < phases.height
    graphs = "graph_ns" in phases.columns and bool((phases["graph_ns"] > 0).any())
    groups = _groups(rows)
    schemes = groups["attribution"].unique(maintain_order=True).to_list()
    columns = {s: _gpu_columns(s, graphs, process, has_energy) for s in schemes}
    tables = {
        s: _table(analysis, s, rows.filter(pl.col("attribution") == s), columns[s], process, i)
        for i, s in enumerate(schemes)
    }
    n_traces = groups["trace"].n_unique()
    has_workers = PROJECTION in schemes
    # each process gets a share of max_rows (at least MIN_GROUP_ROWS): every role shows up
    quota = max(max_rows // max(groups.height, 1), MIN_GROUP_ROWS)
    shown = n_groups = 0
    for group in groups.iter_rows(named=True):
        take = min(quota, max_rows - shown, group["n_rows"])
        if take <= 0:
            break
        table, mine = tables[group["attribution"]], columns[group["attribution"]]
        rows_of = rows.filter(
            (pl.col("trace") == group["trace"])
            & (pl.col("pid") == group["pid"])
            & (pl.col("attribution") == group["attribution"])
        ).sort("step", "start_ns", "level", nulls_last=True)
        if table.row_count:
            table.add_section()
        title = Text(_group_title(group, n_traces, has_workers), style="bold cyan")
        _add(table, "", title)
        for row in rows_of.head(take).iter_rows(named=True):
            table.add_row(*_cells(row, mine))
        shown += take
        if group["n_rows"] > take:
            _add(table, "…", Text(f"{group['n_rows'] - take} more rows in phases.csv"))
        n_groups += 1
    if n_groups < groups.height:
        table = tables[schemes[-1]]
        table.add_section()
        hidden = groups.slice(n_groups)
        noun = "process" if hidden.height == 1 else "processes"
        _add(
            table,
            "…",
            Text(f"{hidden.height} more {noun} ({hidden['n_rows'].sum()} rows) in phases.csv"),
        )
    for table in tables.values():
        _fit(table, width)
    return [t for t in tables.values() if t.row_count]


def _fit(table: Table, width: int | None) -> None:
    """Numbers whole, and the phase column cut (…) to what is left of ``width``.

    Every column gets a fixed width: a number column its widest cell, and its header whole
    where the table then fits ``width``, else wrapped at words; the phase column its longest
    name, or what is left. A narrow terminal so cuts phase names, never a number ("2,338…").
    """

    def longest(column: Column, *extra: int) -> int:
        return max([len(str(c)) for c in column.cells] + [*extra, 1])

    numbers = table.columns[2:]
    step, phase = longest(table.columns[0], 4), longest(table.columns[1], 5)
    whole = [longest(c, len(str(c.header))) for c in numbers]
    wrapped = [longest(c, *(len(w) for w in str(c.header).split())) for c in numbers]
    # each column adds its padding and a border (3); the table's left border, 1
    over = 1 + 3 * len(table.columns) + step
    chosen = whole
    if width is not None and over + sum(whole) + phase > width:
        chosen = wrapped
        phase = min(phase, max(width - over - sum(wrapped), MIN_PHASE_WIDTH))
    table.columns[0].width, table.columns[1].width = step, phase
    for column, size in zip(numbers, chosen, strict=True):
        column.width = size


def _add(table: Table, first: str, text: Text) -> None:
    """A row with only its first two cells filled (a group title, a "more rows" line)."""
    table.add_row(first, text, *[""] * (len(table.columns) - 2))


def _table(
    analysis: Analysis,
    scheme: str,
    rows: pl.DataFrame,
    columns: list[_Column],
    process: bool,
    index: int,
) -> Table:
    """An empty table of one scheme; the first is titled with the run's steps and GPUs."""
    s = analysis.summary
    n_steps = step_count(analysis)
    if index:
        title = f"Worker ranges ({NO_STEPS}, projection)"
        title = "Worker ranges per step (projection)" if n_steps else title
    else:
        title = f"Phases ({NO_STEPS}, {s.n_devices} GPU(s))"
        title = f"Phases per step ({n_steps} steps, {s.n_devices} GPU(s))" if n_steps else title
    table = Table(
        title=title, caption=_caption(analysis, scheme, rows, process), header_style="bold"
    )
    table.add_column("step", justify="right", no_wrap=True)
    # names are cut (…) before numbers are (:func:`_fit`), never wrapped
    table.add_column("phase", justify="left", no_wrap=True)
    for name in ("wall ms", *(c.header for c in columns)):
        table.add_column(name, justify="right")
    return table


def print_report(analysis: Analysis, console: Console, *, max_rows: int = 60) -> None:
    """Print the phase tables, the conservation line and any warnings.

    A CPU-only capture gets no conservation line: the table's caption says it has no GPU work.
    """
    for table in phase_rich_tables(analysis, max_rows=max_rows, width=console.width):
        console.print(table)
    gpu, energy = analysis.summary.gpu, analysis.summary.energy
    if gpu.total_gpu_ns:
        schemes = "; ".join(scheme_gpu_times(analysis, "attributed"))
        console.print(
            Text(f"GPU time {_ms(gpu.total_gpu_ns)} ms in {gpu.n_gpu_ops:,} operations; {schemes}")
        )
    if energy is not None:
        console.print(
            f"GPU energy {energy.total_energy_j:,.3f} J ({energy.power_source}): "
            f"{energy.attributed_energy_j:,.3f} J in phases + "
            f"{energy.unattributed_energy_j:,.3f} J unattributed"
        )
    for warning in analysis.warnings:
        console.print(Text("warning: " + warning, style="yellow"))
