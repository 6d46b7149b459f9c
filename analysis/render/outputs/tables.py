"""The output tables of an analysis, each declared once: the registry :data:`TABLES`.

Writing (:func:`analysis.render.outputs.files.write_outputs`), reading back
(:func:`analysis.render.outputs.files.load_analysis`), the names an output folder may hold, and the
tests of ``--steps`` iterate this list; the CLI and the Python API write through it, so they
write the same files. A table is either an :class:`~analysis.model.Analysis` field saved as it
is (``field``: read back into it) or derived from the analysis by a pure function that lives
with the computations (``aggregate/``, ``energy/``); here it only gets a name and a writer.

Adding a table: the function that computes it, and one :class:`OutputTable` line below.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from ...aggregate.gpu_metrics import TABLE_SCHEMA as GPU_METRICS_SCHEMA
from ...aggregate.kernels_by_phase import kernels_by_phase
from ...aggregate.memory import TABLE_SCHEMA as MEMORY_SCHEMA
from ...aggregate.nccl import nccl_collectives, nccl_collectives_by_phase, nccl_overlap
from ...aggregate.staleness import STALENESS_SCHEMA
from ...attribute.idle_causes import IDLE_CAUSE_SCHEMA
from ...energy.envelope import power_envelope
from ...model import Analysis, RunSummary
from ...workload.token_energy import tokens_energy
from ...workload.tokens import STEP_TOKENS_SCHEMA

#: what a table's ``frame`` returns: a frame, a lazy frame, the summary, or None (not written)
Frame = Any


@dataclass(frozen=True)
class OutputTable:
    """One output file: what it holds, how it is computed, written, read back and selected.

    ``frame(analysis, top_kernels)``: what is written; None (or an empty frame where
    ``skip_empty``) when the analysis cannot support the table, which is then not written
    (never an empty or zero-filled file). ``field``: the :class:`Analysis` field the file saves,
    read back there by ``read``; ``required``: a folder without it is not an analysis folder.
    ``steps``: how ``--steps`` selects it (:mod:`analysis.run.select`).
    """

    name: str
    what: str
    frame: Callable[[Analysis, int | None], Frame]
    write: Callable[[Frame, Path], object]
    steps: str
    field: str | None = None
    read: Callable[[Path], Any] | None = None
    required: bool = False
    skip_empty: bool = False


def _parquet(frame: pl.DataFrame, path: Path) -> None:
    frame.write_parquet(path)


def _csv(frame: pl.DataFrame, path: Path) -> None:
    frame.write_csv(path)


def _csv3(frame: pl.DataFrame, path: Path) -> None:
    frame.write_csv(path, float_precision=3)


def _kernels_csv(frame: pl.DataFrame, path: Path) -> None:
    frame.with_columns(pl.col("op_class").cast(pl.String)).write_csv(path)


def _summary_json(summary: RunSummary, path: Path) -> None:
    path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n", encoding="utf-8")


def _read_summary(path: Path) -> RunSummary:
    return RunSummary.from_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))


def _read_pools(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema_overrides={"devices": pl.String, "processes": pl.String})


def _read_idle_causes(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema=IDLE_CAUSE_SCHEMA)


def _read_gpu_metrics(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema=GPU_METRICS_SCHEMA)


def _read_memory(path: Path) -> pl.DataFrame:
    return pl.read_csv(path, schema=MEMORY_SCHEMA)


def has_kernel_columns(analysis: Analysis) -> bool:
    """Whether the analysis holds its GPU activity (a folder whose activity file is gone does not)."""
    names = analysis.gpu_activity.collect_schema().names()
    return all(c in names for c in ("kind", "name", "start_ns", "end_ns", "op_class"))


def _kernels_by_phase(analysis: Analysis, top: int | None) -> pl.DataFrame | None:
    if not has_kernel_columns(analysis):
        return None
    return kernels_by_phase(analysis.gpu_activity, analysis.phases, top=top)


def _nccl_overlap(analysis: Analysis, _: int | None) -> pl.DataFrame | None:
    if not has_kernel_columns(analysis):
        return None
    return nccl_overlap(analysis.gpu_activity, analysis.phases, analysis.ranges, analysis.pools)


def _nccl_collectives(analysis: Analysis, _: int | None) -> pl.DataFrame | None:
    if not has_kernel_columns(analysis):
        return None
    return nccl_collectives(analysis.gpu_activity, analysis.phases)


def _nccl_by_phase(analysis: Analysis, _: int | None) -> pl.DataFrame | None:
    if not has_kernel_columns(analysis):
        return None
    return nccl_collectives_by_phase(analysis.gpu_activity, analysis.phases)


_BY_STEP = "the rows of the selected steps"

#: every table an analysis writes, in the order written (``gpu_activity.parquet``, the big one,
#: is written meanwhile in a thread)
TABLES: tuple[OutputTable, ...] = (
    OutputTable(
        "phases.parquet",
        "one row per (step, phase path, scheme): wall, GPU busy, kernel, NCCL, copies, energy",
        lambda a, _: a.phases,
        _parquet,
        _BY_STEP,
        field="phases",
        read=pl.read_parquet,
        required=True,
    ),
    OutputTable("phases.csv", "phases.parquet as CSV", lambda a, _: a.phases, _csv, _BY_STEP),
    OutputTable(
        "phase_devices.parquet",
        "window phases per GPU: busy, idle, energy",
        lambda a, _: a.phase_devices,
        _parquet,
        _BY_STEP,
        field="phase_devices",
        read=pl.read_parquet,
        required=True,
    ),
    OutputTable(
        "ranges.parquet",
        "one row per NVTX phase range (what the timeline draws)",
        lambda a, _: a.ranges,
        _parquet,
        _BY_STEP,
        field="ranges",
        read=pl.read_parquet,
    ),
    OutputTable(
        "gpu_activity.parquet",
        "one row per GPU operation with its step and phase under each scheme",
        lambda a, _: a.gpu_activity,
        _parquet,  # not used: files.write_outputs streams or copies it
        "the operations whose window step is selected",
        field="gpu_activity",
        read=pl.scan_parquet,
    ),
    OutputTable(
        "kernels.csv",
        "kernels by name: count, total, mean, class (= nsys stats -r gpukernsum)",
        lambda a, _: a.kernels,
        _kernels_csv,
        "recounted from the selected operations",
        field="kernels",
        read=pl.read_csv,
        required=True,
    ),
    OutputTable(
        "kernels_by_phase.csv",
        "the top kernels of each phase row by GPU time",
        _kernels_by_phase,
        _csv,
        "recomputed from the selected phases and operations",
    ),
    OutputTable(
        "nccl_overlap.csv",
        "NCCL time per phase row and GPU: union, exposed, overlapped by compute",
        _nccl_overlap,
        _csv,
        "recomputed from the selected phases, ranges and operations",
        skip_empty=True,
    ),
    OutputTable(
        "nccl_collectives.csv",
        "NCCL collectives matched across GPUs: per GPU arrival, wait, transfer, straggler",
        _nccl_collectives,
        _csv,
        "recomputed from the selected phases and operations",
        skip_empty=True,
    ),
    OutputTable(
        "nccl_collectives_by_phase.csv",
        "per innermost phase: collectives, total wait vs transfer, most frequent straggler",
        _nccl_by_phase,
        _csv,
        "recomputed from the selected phases and operations",
        skip_empty=True,
    ),
    OutputTable(
        "steps.csv",
        "one row per step window",
        lambda a, _: a.steps,
        _csv,
        _BY_STEP,
        field="steps",
        read=pl.read_csv,
        required=True,
    ),
    OutputTable(
        "power_samples.parquet",
        "power samples on the run's clock",
        lambda a, _: a.power_samples,
        _parquet,
        "the whole run's (energy per phase row comes with the phase rows)",
        field="power_samples",
        read=pl.read_parquet,
    ),
    OutputTable(
        "pools.csv",
        "GPU pools (asynchronous RL): GPUs, processes, GPU time balance per pool",
        lambda a, _: a.pools,
        _csv,
        "the whole run's (a pool's balance is not selected by step)",
        field="pools",
        read=_read_pools,
    ),
    OutputTable(
        "idle_causes.csv",
        "idle GPU time per pool, step (or parameter version) and cause (asynchronous RL)",
        lambda a, _: a.idle_causes,
        _csv,
        _BY_STEP,
        field="idle_causes",
        read=_read_idle_causes,
    ),
    OutputTable(
        "staleness.csv",
        "per trainer step: parameter version lag of the samples it trained on (asynchronous RL)",
        lambda a, _: a.staleness,
        _csv,
        _BY_STEP,
        field="staleness",
        read=lambda path: pl.read_csv(path, schema=STALENESS_SCHEMA),
    ),
    OutputTable(
        "step_tokens.csv",
        "tokens per step (prompt, response) from length records or VeRL logs, when given",
        lambda a, _: a.step_tokens,
        _csv,
        "the selected steps' rows",
        field="step_tokens",
        read=lambda path: pl.read_csv(path, schema=STEP_TOKENS_SCHEMA),
    ),
    OutputTable(
        "tokens_energy.csv",
        "per step and phase: tokens, energy, J/token, tokens/J; inference vs training power",
        lambda a, _: tokens_energy(a),
        _csv,
        "recomputed from the selected phase rows and tokens",
        skip_empty=True,
    ),
    OutputTable(
        "summary.json",
        "run totals, devices, traces, warnings, provenance",
        lambda a, _: a.summary,
        _summary_json,
        "GPU totals recounted from the selected operations; energy totals the whole run's",
        field="summary",
        read=_read_summary,
        required=True,
    ),
    OutputTable(
        "power_envelope.csv",
        "per phase: mean, p95 and peak power per GPU and node, ramp, energy share",
        lambda a, _: power_envelope(a),
        _csv3,
        "recomputed from the selected phase rows",
        skip_empty=True,
    ),
    OutputTable(
        "gpu_metrics_per_phase.csv",
        "nsys GPU metrics per (phase row, GPU, metric): samples, mean, p95, min, max",
        lambda a, _: a.gpu_metrics,
        _csv3,
        _BY_STEP,
        field="gpu_metrics",
        read=_read_gpu_metrics,
        skip_empty=True,
    ),
    OutputTable(
        "memory_per_phase.csv",
        "device memory in use per (phase row, GPU): on entry, peak, time-weighted mean",
        lambda a, _: a.memory,
        _csv,
        _BY_STEP,
        field="memory",
        read=_read_memory,
        skip_empty=True,
    ),
)

TABLE_NAMES: tuple[str, ...] = tuple(t.name for t in TABLES)
BY_NAME: dict[str, OutputTable] = {t.name: t for t in TABLES}
