"""Raw export tables → tidy frames with decoded ids, resolved names and classified GPU operations.

Every timestamp leaving this module is on the run's common clock: the file's own session clock
plus ``offset_ns`` (see :mod:`analysis.run.clocks`).
"""

from __future__ import annotations

import polars as pl

from nvtx_phases.naming import DOMAIN

from ..frames import PolarsDataType
from ..read import specs as T
from ..read.export import RawTrace
from .classes import OP_CLASS_DTYPE, OpClass, kernel_class_expr, memcpy_class_expr
from .devices import fallback_device

#: ENUM_NSYS_EVENT_TYPE ids (stable from 2022.4 to 2026.2).
NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND = 59, 60, 70, 71
NVTX_MARK = 34
NVTX_DOMAIN_CREATE = 75
RANGE_EVENT_TYPES = (NVTX_PUSHPOP, NVTX_STARTEND, NVTXT_PUSHPOP, NVTXT_STARTEND)
#: Start of the warning for NVTX that holds domain events and no range.
NO_RANGES_HINT = "NVTX holds domain events but no range"


def pid_of(global_id: pl.Expr) -> pl.Expr:
    """Process id from a serialized globalTid/globalPid: bits 24..47."""
    return (global_id // (1 << 24)) % (1 << 24)


def tid_of(global_tid: pl.Expr) -> pl.Expr:
    """Thread id from a serialized globalTid: the low 24 bits."""
    return global_tid % (1 << 24)


RANGES_SCHEMA: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "gtid": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "name": pl.String,
    "domain": pl.String,
    "pushpop": pl.Boolean,
    "payload": pl.Int64,
}

OPS_SCHEMA: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "gpid": pl.Int64,
    "pid": pl.Int64,
    "device": pl.String,
    "stream": pl.Int64,
    "kind": pl.String,
    "op_class": OP_CLASS_DTYPE,
    "name": pl.Categorical,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "bytes": pl.Int64,
    "correlation_id": pl.Int64,
}

MARKS_SCHEMA: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "host": pl.String,
    "pid": pl.Int64,
    "ts_ns": pl.Int64,
    "text": pl.String,
    "domain": pl.String,
}

RUNTIME_SCHEMA: dict[str, PolarsDataType] = {
    "trace": pl.String,
    "gtid": pl.Int64,
    "pid": pl.Int64,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "correlation_id": pl.Int64,
}


def strings_of(raw: RawTrace) -> pl.DataFrame:
    """The export's string table (``id, value``), empty when absent."""
    frame = raw.frame(T.STRING_IDS)
    if frame is None:
        return pl.DataFrame(schema={"id": pl.Int64, "value": pl.String})
    return frame.select(pl.col("id").cast(pl.Int64), pl.col("value").cast(pl.String))


def _with_string(frame: pl.DataFrame, strings: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
    lookup = strings.rename({"id": id_col, "value": out})
    return frame.join(lookup, on=id_col, how="left")


def _nvtx_events(raw: RawTrace) -> pl.DataFrame | None:
    """NVTX events with ``message`` (text or registered string), ``pid`` and ``domain`` name."""
    events = raw.frame(T.NVTX_EVENTS)
    if events is None or events.is_empty():
        return None
    events = _with_string(events, strings_of(raw), "textId", "registered_text")
    events = events.with_columns(
        pl.coalesce(pl.col("text").cast(pl.String), pl.col("registered_text")).alias("message"),
        pid_of(pl.col("globalTid")).alias("pid"),
        pl.col("domainId").fill_null(0).alias("domainId"),
    )
    domains = (
        events.filter(pl.col("eventType") == NVTX_DOMAIN_CREATE)
        .group_by("pid", "domainId")
        .agg(pl.col("message").sort_by("start").first().alias("domain"))
    )
    return events.join(domains, on=["pid", "domainId"], how="left")


def nvtx_marks(raw: RawTrace, *, offset_ns: int = 0) -> pl.DataFrame:
    """NVTX marks (instant events): time, text, domain, process, host."""
    events = _nvtx_events(raw)
    if events is None:
        return pl.DataFrame(schema=MARKS_SCHEMA)
    return (
        events.filter(pl.col("eventType") == NVTX_MARK)
        .select(
            pl.lit(raw.label).alias("trace"),
            pl.lit(raw.host).alias("host"),
            "pid",
            (pl.col("start") + offset_ns).alias("ts_ns"),
            pl.col("message").fill_null("").alias("text"),
            pl.col("domain").fill_null("").alias("domain"),
        )
        .cast(MARKS_SCHEMA)  # type: ignore[arg-type]
    )


def _cut_at_capture_end(raw: RawTrace, ranges: pl.DataFrame) -> list[str]:
    """A warning for ranges that nsys closed at the capture's end (``ANALYSIS_DETAILS.duration``).

    nsys 2022.4 ends a range still open when the capture stops at the capture's duration: a
    process killed before its NVTX buffer was flushed (a Ray actor at shutdown) loses its last
    pops, and the range then runs to the end of the capture, not to its real end.
    """
    if raw.duration_ns is None:
        return []
    cut = ranges.filter((pl.col("end") == raw.duration_ns) & (pl.col("start") < raw.duration_ns))
    if cut.is_empty():
        return []
    names = sorted(set(cut["message"].fill_null("").to_list()))
    shown = ", ".join(repr(n) for n in names[:5]) + (", …" if len(names) > 5 else "")
    return [
        f"{raw.label}: {cut.height} NVTX range(s) end exactly at the end of the capture ({shown}): "
        "nsys closes a range still open when the capture stops (its process exited before its "
        "last NVTX events were flushed, or it was still running), so their durations run to "
        "the capture's end, not to the range's own end"
    ]


def nvtx_ranges(raw: RawTrace, *, offset_ns: int = 0) -> tuple[pl.DataFrame, list[str]]:
    """NVTX push/pop and start/end ranges with message text, domain name and integer payload.

    Ranges left open at the end of the capture are closed at the last timestamp of the file,
    as NVIDIA's reports do, and counted in a warning; ranges that end before they start are
    dropped with a warning.
    """
    events = _nvtx_events(raw)
    warnings: list[str] = []
    if events is None:
        return pl.DataFrame(schema=RANGES_SCHEMA), warnings
    ranges = events.filter(pl.col("eventType").is_in(RANGE_EVENT_TYPES))
    # domains created but nothing in them recorded; a process that only marks (an inference
    # server's pool mark) has its marks, and nothing is missing
    marks_only = events["eventType"].is_in([NVTX_MARK]).any()
    if (
        ranges.is_empty()
        and events["eventType"].is_in([NVTX_DOMAIN_CREATE]).any()
        and not marks_only
    ):
        warnings.append(
            f"{raw.label}: {NO_RANGES_HINT}: this nsys did not record the "
            "ranges of the Python nvtx package in use (nsys 2022.4/2023.4 with nvtx >= 0.2.9); "
            "install nvtx==0.2.8 in the traced environment, or capture with a newer nsys"
        )
    last_ts = events.select(pl.max_horizontal(pl.col("start").max(), pl.col("end").max())).item()
    n_open = ranges["end"].null_count()
    if n_open:
        warnings.append(
            f"{raw.label}: {n_open} NVTX range(s) never closed (push without pop or start "
            "without end); closed at the last timestamp of the capture"
        )
    ranges = ranges.with_columns(pl.col("end").fill_null(last_ts))
    warnings += _cut_at_capture_end(raw, ranges)
    n_backwards = ranges.filter(pl.col("end") < pl.col("start")).height
    if n_backwards:
        warnings.append(f"{raw.label}: {n_backwards} NVTX range(s) end before they start; dropped")
        ranges = ranges.filter(pl.col("end") >= pl.col("start"))
    frame = ranges.select(
        pl.lit(raw.label).alias("trace"),
        pl.col("globalTid").alias("gtid"),
        pl.col("pid"),
        tid_of(pl.col("globalTid")).alias("tid"),
        (pl.col("start") + offset_ns).alias("start_ns"),
        (pl.col("end") + offset_ns).alias("end_ns"),
        pl.col("message").fill_null("").alias("name"),
        pl.col("domain").fill_null("").alias("domain"),
        pl.col("eventType").is_in([NVTX_PUSHPOP, NVTXT_PUSHPOP]).alias("pushpop"),
        pl.coalesce(
            "int64Value",
            "uint64Value",
            "int32Value",
            "uint32Value",
            # nvtx_phases' own convention where the nvtx package cannot send a payload
            pl.when((pl.col("domain") == DOMAIN) & (pl.col("category") > 0)).then("category"),
        )
        .cast(pl.Int64)
        .alias("payload"),
    )
    return frame.cast(RANGES_SCHEMA), warnings  # type: ignore[arg-type]


#: The GPU operation tables, in the order their rows are numbered (``op_id``).
OP_TABLES = {"kernel": T.KERNELS, "memcpy": T.MEMCPY, "memset": T.MEMSET, "graph": T.GRAPH_TRACE}


def gpu_op_rows(
    kind: str,
    frame: pl.DataFrame,
    strings: pl.DataFrame,
    *,
    label: str,
    identities: pl.DataFrame | None = None,
    offset_ns: int = 0,
) -> pl.DataFrame:
    """Rows of one GPU operation table (``kind``: kernel, memcpy, memset or graph) in the ops layout.

    ``identities`` (:func:`analysis.normalize.devices.gpu_identities`) names each operation's physical GPU;
    devices it does not describe are named ``<label>:<deviceId>``.
    """
    if kind == "kernel":
        frame = _with_string(frame, strings, "demangledName", "name")
        frame = _with_string(frame, strings, "shortName", "short")
        frame = frame.with_columns(
            kernel_class_expr(pl.coalesce("short", "name").fill_null("")).alias("op_class"),
            pl.lit(0, dtype=pl.Int64).alias("bytes"),
        )
    elif kind == "memcpy":
        frame = frame.with_columns(
            memcpy_class_expr(pl.col("copyKind")).alias("op_class")
        ).with_columns(pl.format("[CUDA memcpy {}]", pl.col("op_class")).alias("name"))
    elif kind == "graph":
        frame = frame.with_columns(
            pl.lit(OpClass.CUDA_GRAPH.value).alias("op_class"),
            pl.when(pl.col("graphId").is_not_null())
            .then(pl.format("[CUDA graph {}]", pl.col("graphId")))
            .otherwise(pl.lit("[CUDA graph]"))
            .alias("name"),
            pl.lit(0, dtype=pl.Int64).alias("bytes"),
        )
    else:
        frame = frame.with_columns(
            pl.lit(OpClass.MEMSET.value).alias("op_class"),
            pl.lit("[CUDA memset]").alias("name"),
        )
    if identities is not None and identities.height:
        frame = frame.join(
            identities.select(
                pl.col("device_id").alias("deviceId"), pl.col("device").alias("_gpu")
            ),
            on="deviceId",
            how="left",
        )
    else:
        frame = frame.with_columns(pl.lit(None, dtype=pl.String).alias("_gpu"))
    return frame.select(
        pl.lit(label).alias("trace"),
        pl.col("globalPid").alias("gpid"),
        pid_of(pl.col("globalPid")).alias("pid"),
        pl.coalesce("_gpu", fallback_device(label, pl.col("deviceId"))).alias("device"),
        pl.col("streamId").alias("stream"),
        pl.lit(kind).alias("kind"),
        pl.col("op_class"),
        pl.col("name"),
        (pl.col("start") + offset_ns).alias("start_ns"),
        (pl.col("end") + offset_ns).alias("end_ns"),
        pl.col("bytes"),
        pl.col("correlationId").alias("correlation_id"),
    ).cast(OPS_SCHEMA)  # type: ignore[arg-type]


def runtime_rows(frame: pl.DataFrame, *, label: str, offset_ns: int = 0) -> pl.DataFrame:
    """Runtime/driver API rows that carry a correlation id (the launches), in runtime layout."""
    return (
        frame.filter(pl.col("correlationId").is_not_null() & (pl.col("correlationId") != 0))
        .select(
            pl.lit(label).alias("trace"),
            pl.col("globalTid").alias("gtid"),
            pid_of(pl.col("globalTid")).alias("pid"),
            (pl.col("start") + offset_ns).alias("start_ns"),
            (pl.col("end") + offset_ns).alias("end_ns"),
            pl.col("correlationId").alias("correlation_id"),
        )
        .cast(RUNTIME_SCHEMA)  # type: ignore[arg-type]
    )
