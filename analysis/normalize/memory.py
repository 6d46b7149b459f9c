"""Read device memory allocations and frees of a run's exports, on the run's clock.

nsys (``--cuda-memory-usage=true``) writes ``CUDA_GPU_MEMORY_USAGE_EVENTS``: one row per CUDA
allocation (``memoryOperationType`` 0) or deallocation (1) of ``bytes`` on ``deviceId``, of a
memory kind (``ENUM_CUDA_MEM_KIND``). Only device-resident kinds count here (:data:`DEVICE_KINDS`:
Device, Array, Device Static); pageable, pinned (host memory) and managed memory do not. A
PyTorch profiler trace's ``[memory]`` events are read as the same table by
:mod:`analysis.read.kineto`, with the caching allocator's ``Total Allocated`` after each event.

What the two count differs: nsys sees the CUDA calls (with PyTorch, the caching allocator's
segments, i.e. *reserved* memory), Kineto the allocator's tensors (*allocated* memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from ..errors import MissingColumns, TraceReadError
from ..frames import PolarsDataType
from ..model import TraceInfo
from ..read import specs as T
from ..read.export import Export, RawTrace
from .devices import fallback_device, gpu_identities

#: ENUM_CUDA_MEM_KIND ids of memory on the GPU: Device, Array, Device Static
DEVICE_KINDS = (2, 3, 5)
#: one allocation (delta > 0) or free (delta < 0) on the run's clock
EVENTS_SCHEMA: dict[str, PolarsDataType] = {
    "ts_ns": pl.Int64,
    "device": pl.String,
    "source": pl.String,
    "seq": pl.Int64,
    "delta": pl.Int64,
    "total": pl.Int64,
}
NO_TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
HINT = "capture with `nsys profile --cuda-memory-usage=true` or torch.profiler(profile_memory=True)"


def trace_memory_events(trace: TraceInfo) -> tuple[pl.DataFrame | None, list[str]]:
    """One file's device memory events (:data:`EVENTS_SCHEMA`), None when it has none, and notes."""
    path = Path(trace.path)
    try:
        export = Export(path)
    except TraceReadError as exc:
        return None, [f"{exc}: its memory events are left out"]
    try:
        if export.resolve_table(T.CUDA_MEMORY_USAGE) is None:
            return None, []
        rows = export.read(T.CUDA_MEMORY_USAGE)
        gpus = export.read(T.TARGET_GPU)
    except (MissingColumns, TraceReadError) as exc:
        return None, [f"{exc}: its memory events are left out"]
    finally:
        export.close()
    if rows is None or rows.is_empty():
        return None, []
    raw = RawTrace(
        path=path,
        label=trace.label,
        frames={} if gpus is None else {T.TARGET_GPU.name: gpus},
        missing_tables=[],
        meta={},
        session_start_utc_ns=None,
        clock_zero_utc_ns=None,
        duration_ns=None,
        host=trace.host or "",
    )
    ids = gpu_identities(raw).select("device_id", "device")
    sign = pl.when(pl.col("memoryOperationType") == 1).then(-1).otherwise(1)
    events = (
        rows.with_row_index("seq")
        .filter(pl.col("memKind").is_in(DEVICE_KINDS))
        .with_columns(pl.col("deviceId").cast(pl.Int64).alias("device_id"))
        .join(ids, on="device_id", how="left", maintain_order="left")
        .select(
            (pl.col("start").cast(pl.Int64) + trace.clock_offset_ns).alias("ts_ns"),
            pl.coalesce("device", fallback_device(trace.label, pl.col("device_id"))).alias(
                "device"
            ),
            (
                pl.lit(f"{trace.label}:")
                + (pl.col("globalPid").cast(pl.Int64) // (1 << 24)).fill_null(0).cast(pl.String)
            ).alias("source"),
            pl.col("seq").cast(pl.Int64),
            (sign * pl.col("bytes").cast(pl.Int64)).alias("delta"),
            pl.col("totalAllocated").cast(pl.Int64).alias("total"),
        )
    )
    return events.cast(EVENTS_SCHEMA), []  # type: ignore[arg-type]


def read_run_memory_events(traces: Sequence[TraceInfo]) -> tuple[pl.DataFrame, list[str]]:
    """Every file's device memory events, on the run's clock, and notes (one when none has any)."""
    parts: list[pl.DataFrame] = []
    notes: list[str] = []
    for trace in traces:
        events, found = trace_memory_events(trace)
        notes += found
        if events is not None and events.height:
            parts.append(events)
    if not parts:
        notes.append(f"no {NO_TABLE} in the run's files ({HINT}): no memory per phase table")
        return pl.DataFrame(schema=EVENTS_SCHEMA), notes
    return pl.concat(parts), notes
