"""The Kineto reader: a PyTorch profiler Chrome trace read as the tables of an nsys export.

:mod:`analysis.read.kineto_parse` turns the trace's events into rows; here they become the
frames of the nsys tables that :mod:`analysis.read.specs` declares (``NVTX_EVENTS``, the kernel,
memcpy, memset and runtime tables, ``StringIds``, processes, thread names, GPUs, session start,
capture duration, metadata), so everything after :func:`analysis.read.export.open_export` reads a
Kineto trace as it reads an nsys export. The file is parsed once per process (several readers
open one export: the runtime calls in threads, the operations in batches) and kept in a small
cache keyed by path, size and modification time.

Clock: ``ts`` counts µs from ``baseTimeNanoseconds`` (UTC epoch ns; Kineto 2023+), or, in traces
without it, is itself UNIX epoch µs (checked: above 10^14 µs). Timestamps are stored in ns from
the whole µs at the start of the profiling window (the ``Trace`` span), and the file's clock zero
(:attr:`RawTrace.clock_zero_utc_ns`) is that instant in UTC, so :mod:`analysis.run.clocks` puts
several ranks on one clock through UTC, like nsys files (as well as the hosts' clocks agree).
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from ..errors import AnalysisError, MissingColumns, TraceReadError
from .common import source_column, with_absent
from .kineto_parse import (
    EPOCH_US,
    KinetoFormatError,
    Parsed,
    Rows,
    as_int,
    copy_kind,
    device_properties,
    distributed,
    load_document,
    parse,
)
from .specs import TableSpec

#: Names a Kineto trace file has; any other file whose content is a Chrome trace counts too.
KINETO_SUFFIXES = (".json", ".json.gz")
_KIND = "PyTorch profiler (Kineto) trace"
_TID = 1 << 24
_INT, _STR = pl.Int64, pl.String


class KinetoReadError(TraceReadError):
    """A file taken for a Kineto trace that cannot be read (truncated, not JSON, no events)."""

    def __init__(self, path: str, reason: str, kind: str = _KIND) -> None:
        AnalysisError.__init__(self, f"{path}: cannot read as a {kind} ({reason})")
        self.path, self.reason, self.kind = path, reason, kind


def is_kineto_file(path: Path) -> bool:
    """Whether ``path`` is a file that is JSON (or gzip), not SQLite: a Kineto trace to read.

    Named ``*.sqlite``, a file is read as SQLite whatever it holds (and refused as such).
    """
    try:
        if path.suffix == ".sqlite" or not path.is_file():
            return False
        with path.open("rb") as fh:
            head = fh.read(64)
    except OSError:
        return False
    return head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"[")


def holds_trace_events(path: Path, limit: int = 1 << 20) -> bool:
    """Whether ``path`` is JSON (or gzip'd JSON) whose first ``limit`` bytes name ``traceEvents``.

    Used to pick trace files out of a folder that may hold other JSON (outputs, configs).
    """
    if not is_kineto_file(path):
        return False
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.open(fh) as inner:
                    head = inner.read(limit)
            else:
                head = fh.read(limit)
    except (OSError, EOFError, zlib.error):
        return True  # a damaged trace: the reader says what is wrong with it
    return b'"traceEvents"' in head


def kineto_stem(path: Path) -> str:
    """The trace's name without ``.json``, ``.json.gz`` and ``.pt.trace``."""
    name = path.name
    for suffix in (".json.gz", ".json", ".pt.trace"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


class KinetoExport:
    """One Kineto trace as a :class:`~analysis.read.common.TableSource` (tables in memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise KinetoReadError(str(path), "no such file")
        tables, notes = _tables(path)
        self._tables = tables
        #: what this trace lacks that an nsys export has (read_export adds them to warnings)
        self.notes = notes
        self.table_names = set(tables)

    def close(self) -> None:
        """Nothing stays open."""

    def columns(self, table: str) -> dict[str, str]:
        """Column name → Polars type of ``table``."""
        return {name: str(dtype) for name, dtype in self._tables[table].schema.items()}

    def resolve_table(self, spec: TableSpec) -> str | None:
        """The name ``spec``'s table has here, or None when the trace has no such rows."""
        return next((n for n in (spec.name, *spec.alt_names) if n in self._tables), None)

    def read(self, spec: TableSpec) -> pl.DataFrame | None:
        """The declared columns of ``spec``; None when the table is absent."""
        table = self.resolve_table(spec)
        if table is None:
            return None
        frame = self._tables[table]
        chosen: dict[str, str] = {}
        missing: list[str] = []
        absent: list[str] = []
        for col in (*spec.required, *spec.optional):
            source = source_column(spec, col, frame.columns)
            if source is not None:
                chosen[col] = source
            else:
                (missing if col in spec.required else absent).append(col)
        if missing:
            raise MissingColumns(str(self.path), table, missing)
        selected = frame.select(pl.col(s).alias(c) for c, s in chosen.items())
        return with_absent(selected, absent, spec.text)

    def rowid_span(self, spec: TableSpec) -> tuple[int, int] | None:
        """``(0, rows)`` of ``spec``'s table; None when absent or empty."""
        table = self.resolve_table(spec)
        rows = self._tables[table].height if table is not None else 0
        return (0, rows) if rows else None

    def batches(
        self, spec: TableSpec, rows: int, *, rowids: tuple[int, int] | None = None
    ) -> Iterator[pl.DataFrame]:
        """The declared columns of ``spec`` in slices of ``rows`` rows (positions ``rowids``)."""
        frame = self.read(spec)
        if frame is None:
            return
        lo, hi = rowids if rowids is not None else (0, frame.height)
        for offset in range(lo, hi, rows):
            part = frame.slice(offset, min(rows, hi - offset))
            if part.height:
                yield part


_CACHE: dict[tuple[str, int, int], tuple[dict[str, pl.DataFrame], list[str]]] = {}
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4


def _tables(path: Path) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """The tables of ``path``, parsed once per process (readers open one trace several times)."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    with _CACHE_LOCK:  # threads opening the same trace wait for one parse
        if key not in _CACHE:
            try:
                parsed = parse(load_document(path))
            except KinetoFormatError as exc:
                raise KinetoReadError(str(path), str(exc)) from None
            except RecursionError:
                raise KinetoReadError(str(path), "JSON nested too deeply") from None
            if len(_CACHE) >= _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[key] = build_tables(parsed, path.name)
        return _CACHE[key]


def _frame(rows: Rows, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(rows.data, schema={c: schema.get(c, _INT) for c in rows.columns})


def build_tables(parsed: Parsed, name: str) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """The nsys tables of one parsed trace and the notes on what it lacks."""
    meta = parsed.doc_meta
    window = (
        (min(w[0] for w in parsed.windows), max(w[1] for w in parsed.windows))
        if parsed.windows
        else None
    )
    first = window[0] if window else parsed.first_ns
    origin = (first // 1000) * 1000 if first is not None else 0  # a whole µs: exact offsets
    base = as_int(meta.get("baseTimeNanoseconds"))
    if base is not None:
        zero: int | None = base + origin
    elif first is not None and first >= EPOCH_US * 1000:
        zero = origin
    else:
        zero = None
    tables: dict[str, pl.DataFrame] = {}
    runtime = _frame(parsed.runtime, {})
    gpu_rows = sum(len(r) for r in parsed.ops.values()) + len(runtime)
    if len(parsed.ranges):
        tables["NVTX_EVENTS"] = _ranges(parsed, origin)
    if gpu_rows:
        tables.update(_gpu_tables(parsed, runtime, origin))
    if len(parsed.memory):
        tables["CUDA_GPU_MEMORY_USAGE_EVENTS"] = _memory_table(parsed, origin)
    tables.update(_meta_tables(parsed, window, origin, zero))
    return tables, _notes(parsed, name, base, zero, window, gpu_rows)


def _memory_table(parsed: Parsed, origin: int) -> pl.DataFrame:
    """``[memory]`` events as CUDA_GPU_MEMORY_USAGE_EVENTS rows (device memory, alloc 0 / free 1)."""
    frame = _frame(parsed.memory, {})
    return frame.select(
        (pl.col("start") - origin).alias("start"),
        (pl.col("pid").fill_null(0) * _TID).alias("globalPid"),
        "deviceId",
        pl.col("delta").abs().alias("bytes"),
        pl.lit(2, dtype=_INT).alias("memKind"),  # ENUM_CUDA_MEM_KIND: Device
        pl.when(pl.col("delta") < 0).then(1).otherwise(0).cast(_INT).alias("memoryOperationType"),
        "totalAllocated",
    )


def _shift(frame: pl.DataFrame, origin: int) -> pl.DataFrame:
    """``start``/``dur`` → ``start``/``end`` in ns from ``origin``."""
    return frame.with_columns(
        (pl.col("start") - origin).alias("start"),
        (pl.col("start") + pl.col("dur") - origin).alias("end"),
    ).drop("dur")


def _gtid(pid: pl.Expr, tid: pl.Expr) -> pl.Expr:
    """The serialized globalTid of nsys: pid in bits 24..47, tid in the low 24 bits."""
    return pid.fill_null(0) * _TID + tid.fill_null(0) % _TID


def _ranges(parsed: Parsed, origin: int) -> pl.DataFrame:
    frame = _shift(_frame(parsed.ranges, {}), origin)
    return frame.select(
        "start",
        "end",
        pl.lit(59, dtype=_INT).alias("eventType"),  # NVTX push/pop range
        _gtid(pl.col("pid"), pl.col("tid")).alias("globalTid"),
        "textId",
    )


def _gpu_tables(parsed: Parsed, runtime: pl.DataFrame, origin: int) -> dict[str, pl.DataFrame]:
    """Kernels, memcpy, memset (each with its launching process) and runtime calls."""
    launcher = (
        runtime.filter(pl.col("correlationId").is_not_null())
        .unique(subset="correlationId", keep="first", maintain_order=True)
        .select("correlationId", pl.col("pid").alias("_pid"))
    )
    pids = runtime["pid"].drop_nulls()
    if pids.is_empty():
        pids = pl.Series([r for r in parsed.ranges.data["pid"] if r is not None], dtype=_INT)
    main_pid = int(pids.mode().sort()[0]) if len(pids) else 0
    names = pl.DataFrame(
        {"nameId": list(parsed.strings.values()), "_name": list(parsed.strings)},
        schema={"nameId": _INT, "_name": _STR},
    )
    tables = {}
    for kind, table in (
        ("kernel", "CUPTI_ACTIVITY_KIND_KERNEL"),
        ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
        ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"),
    ):
        ops = _shift(_frame(parsed.ops[kind], {}), origin).join(
            launcher, on="correlationId", how="left"
        )
        ops = ops.with_columns((pl.col("_pid").fill_null(main_pid) * _TID).alias("globalPid"))
        if kind == "kernel":
            ops = ops.rename({"nameId": "demangledName"})
        elif kind == "memcpy":
            ops = ops.join(names, on="nameId", how="left").with_columns(
                pl.col("_name")
                .map_elements(copy_kind, return_dtype=_INT, skip_nulls=False)
                .alias("copyKind")
            )
        tables[table] = ops.drop("_pid", "_name", "nameId", strict=False)
    tables["CUPTI_ACTIVITY_KIND_RUNTIME"] = _shift(runtime, origin).select(
        "start", "end", _gtid(pl.col("pid"), pl.col("tid")).alias("globalTid"),
        "correlationId", "nameId",
    )  # fmt: skip
    return tables


def _meta_tables(
    parsed: Parsed, window: tuple[int, int] | None, origin: int, zero: int | None
) -> dict[str, pl.DataFrame]:
    """Processes, thread names, GPUs, session start, capture duration, metadata, host."""
    meta = parsed.doc_meta
    procs = parsed.process_names
    thread_ids = [parsed.string_id(n) for n in parsed.thread_names.values()]
    gpus = device_properties(meta)
    start = (window[0] if window else parsed.first_ns or origin) - origin
    info = distributed(meta)
    pairs = {
        "EXPORT_PRODUCT_VERSION": f"n/a (Kineto trace, schemaVersion {meta.get('schemaVersion')})",
        "INPUT_FORMAT": "kineto",
        **{f"KINETO_{k.upper()}": v for k, v in info.items()},
    }
    tables = {
        "PROCESSES": pl.DataFrame(
            {"globalPid": [p * _TID for p in procs], "pid": list(procs), "name": list(procs.values())},
            schema={"globalPid": _INT, "pid": _INT, "name": _STR},
        ),
        "ThreadNames": pl.DataFrame(
            {"nameId": thread_ids, "globalTid": [p * _TID + t % _TID for p, t in parsed.thread_names]},
            schema={"nameId": _INT, "globalTid": _INT},
        ),
        "META_DATA_EXPORT": _pairs(pairs),
        "TARGET_INFO_GPU": pl.DataFrame(
            {"id": [g[0] for g in gpus], "name": [g[1] for g in gpus]},
            schema={"id": _INT, "name": _STR},
        ),
        # the string table again: thread names were added to it above
        "StringIds": pl.DataFrame(
            {"id": list(parsed.strings.values()), "value": list(parsed.strings)},
            schema={"id": _INT, "value": _STR},
        ),
    }  # fmt: skip
    host = meta.get("host_name") or meta.get("hostname")
    if isinstance(host, str) and host:
        tables["TARGET_INFO_SYSTEM_ENV"] = _pairs({"Hostname": host})
    if zero is not None:
        tables["TARGET_INFO_SESSION_START_TIME"] = pl.DataFrame(
            {"utcEpochNs": [zero + start], "systemClockNs": [start]}, schema={"utcEpochNs": _INT, "systemClockNs": _INT}
        )  # fmt: skip
    if window is not None:
        tables["ANALYSIS_DETAILS"] = pl.DataFrame(
            {"duration": [window[1] - window[0]], "startTime": [start]},
            schema={"duration": _INT, "startTime": _INT},
        )
    return tables


def _pairs(pairs: dict[str, str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"name": list(pairs), "value": list(pairs.values())}, schema={"name": _STR, "value": _STR}
    )


def _notes(
    parsed: Parsed,
    name: str,
    base: int | None,
    zero: int | None,
    window: tuple[int, int] | None,
    gpu_rows: int,
) -> list[str]:
    """One line on what this trace lacks next to an nsys export, and how its clock was read."""
    info = distributed(parsed.doc_meta)
    rank = f" rank {info['rank']}" if "rank" in info else ""
    rank += f" of {info['world_size']}" if rank and "world_size" in info else ""
    lacks = ["an nsys version"]
    if window is None:
        lacks.append("a profiling window (Trace span): capture duration unknown")
    if not gpu_rows:
        lacks.append("GPU activity (CPU-only profile)")
    if base is not None:
        clock = "clock: baseTimeNanoseconds + ts (UTC)"
    elif zero is not None:
        clock = "clock: ts read as UNIX epoch µs (no baseTimeNanoseconds)"
    else:
        clock = "clock unknown (no baseTimeNanoseconds, ts not epoch µs): not aligned with others"
    extra = []
    if parsed.n_gpu_ranges:
        extra.append(
            f"{parsed.n_gpu_ranges} gpu_user_annotation events (GPU-side copies of the CPU "
            "annotations) are not phase ranges"
        )
    if parsed.n_skipped:
        extra.append(f"{parsed.n_skipped} complete events without a numeric ts/dur skipped")
    return [
        f"{name}: PyTorch profiler (Kineto) trace{rank}; lacks {', '.join(lacks)}; {clock}"
        + "".join(f"; {e}" for e in extra)
    ]
