"""Read one Nsight Systems export into Polars frames, whatever its container.

Two containers hold the same tables and columns: an ``nsys export --type sqlite`` file
(:mod:`analysis.read.sqlite`) and an ``nsys export --type parquetdir`` folder of Parquet files
(:mod:`analysis.read.parquetdir`). A PyTorch profiler (Kineto) trace is read as the same tables
(:mod:`analysis.read.kineto`). :func:`open_export` opens any of them; everything after it reads
through the declared table specs of :mod:`analysis.read.specs`, so all give the same frames.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ..errors import MissingColumns, NotAnNsysExport
from . import specs as T
from .common import TableSource, decode_text_columns
from .kineto import KinetoExport, is_kineto_file, kineto_stem
from .parquetdir import ParquetDirExport, export_stem, is_parquetdir
from .specs import TableSpec
from .sqlite import SqliteExport, sqlite_readonly_uri

__all__ = [
    "Export",
    "RawTrace",
    "TableSource",
    "decode_text_columns",
    "is_nsys_export",
    "open_export",
    "read_export",
    "sqlite_readonly_uri",
    "trace_stem",
]


@dataclass
class RawTrace:
    """The tables of one export that analysis needs, as read, plus what was missing."""

    path: Path
    label: str
    frames: dict[str, pl.DataFrame]
    missing_tables: list[str]
    meta: dict[str, str]
    session_start_utc_ns: int | None
    #: UTC ns of the file's timestamp zero (see :mod:`analysis.run.clocks`)
    clock_zero_utc_ns: int | None
    duration_ns: int | None
    host: str
    warnings: list[str] = field(default_factory=list)

    def frame(self, spec: TableSpec) -> pl.DataFrame | None:
        """The frame read for ``spec``, or None when the export lacks that table."""
        return self.frames.get(spec.name)

    @property
    def driver_version(self) -> str:
        """NVIDIA driver version as the export states it ("" when absent or 0 on CPU-only hosts)."""
        env = _pairs(self.frames.get(T.SYSTEM_ENV.name))
        version = env.get("NvDriverVersion", "")
        if version in ("", "0"):
            return ""
        # nsys stores 525.105.17 as 52510517
        if version.isdigit() and len(version) >= 6:
            return f"{int(version[:-5])}.{version[-5:-2]}.{version[-2:]}"
        return version

    @property
    def nsys_version(self) -> str:
        """The exporting nsys version as the export states it, or ``"unknown"``."""
        return self.meta.get("EXPORT_PRODUCT_VERSION", "unknown")


def open_export(path: str | Path) -> TableSource:
    """Open one export read-only: a parquetdir folder, a Kineto trace (JSON), else SQLite."""
    path = Path(path)
    if is_parquetdir(path):
        return ParquetDirExport(path)
    if is_kineto_file(path):
        return KinetoExport(path)
    return SqliteExport(path)


#: The name readers have always opened exports by; the same as :func:`open_export`.
Export = open_export


_ALWAYS_READ = (
    T.STRING_IDS,
    T.SESSION_START,
    T.ANALYSIS_DETAILS,
    T.PROCESSES,
    T.THREAD_NAMES,
    T.EXPORT_META,
    T.SYSTEM_ENV,
    T.TARGET_GPU,
    # GPU_METRICS is not read here: at 10 kHz × 22 metrics per GPU it can hold 10^8 rows;
    # analysis.normalize.gpu_metrics streams the metrics it needs
)


def is_nsys_export(table_names: Collection[str]) -> bool:
    """Whether a database's tables are those of an ``nsys export --type sqlite`` file.

    Every export has ``StringIds``; besides it, the metadata table (2022+), the session start, or,
    in exports older than both (nsys 2021), the activity tables themselves.
    """
    if "StringIds" not in table_names:
        return False
    return any(
        name in table_names
        for name in (T.EXPORT_META.name, *T.EXPORT_META.alt_names, T.SESSION_START.name)
    ) or any(name.startswith(("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")) for name in table_names)


def read_export(
    path: str | Path, *, label: str | None = None, streamed: Collection[TableSpec] = ()
) -> RawTrace:
    """Read one export (an ``nsys export`` SQLite file or parquetdir folder).

    Tables the capture did not collect (lazy exports omit them) are listed in
    ``missing_tables``; a file that is not an nsys export raises :class:`NotAnNsysExport`.
    ``streamed`` tables are only checked for presence: the caller reads them in batches
    (:meth:`Export.batches`).
    """
    path = Path(path)
    export = open_export(path)
    try:
        if not is_nsys_export(export.table_names):
            raise NotAnNsysExport(str(path))
        frames: dict[str, pl.DataFrame] = {}
        missing: list[str] = []
        read_warnings: list[str] = []
        for spec in (*T.DATA_TABLES, *T.OPTIONAL_DATA_TABLES, *_ALWAYS_READ):
            if spec in streamed:
                if export.resolve_table(spec) is None and spec in T.DATA_TABLES:
                    missing.append(spec.name)
                continue
            try:
                frame = export.read(spec)
            except MissingColumns as exc:
                if spec in T.DATA_TABLES:
                    raise
                # metadata in a layout this version does not know: analysis goes on without it
                read_warnings.append(
                    f"{path.name}: {exc.table} skipped (lacks {', '.join(exc.columns)})"
                )
                continue
            if frame is None:
                if spec in T.DATA_TABLES:
                    missing.append(spec.name)
                continue
            frames[spec.name] = frame
        # what a non-nsys source (a Kineto trace) lacks next to an nsys export
        read_warnings += getattr(export, "notes", [])
    finally:
        export.close()

    meta = _pairs(frames.get(T.EXPORT_META.name))
    env = _pairs(frames.get(T.SYSTEM_ENV.name))
    start = frames.get(T.SESSION_START.name)
    details = frames.get(T.ANALYSIS_DETAILS.name)
    warnings = read_warnings
    session_start = None
    clock_zero = None
    if start is not None and start.height:
        session_start = int(start["utcEpochNs"][0])
        # nsys 2026+: timestamps on the host's clock, whose reading at the start is given
        clock_zero = session_start - int(start["systemClockNs"].fill_null(0)[0])
    else:
        warnings.append(
            f"{path.name}: no TARGET_INFO_SESSION_START_TIME; cannot align its clock with other files"
        )
    if not meta:
        warnings.append(
            f"{path.name}: no export metadata table (an nsys release older than 2022?): "
            "nsys version unknown"
        )
    return RawTrace(
        path=path,
        label=label or trace_stem(path),
        frames=frames,
        missing_tables=missing,
        meta=meta,
        session_start_utc_ns=session_start,
        clock_zero_utc_ns=clock_zero,
        duration_ns=int(details["duration"][0]) if details is not None and details.height else None,
        host=env.get("Hostname", meta.get("EXPORT_HOST", "")),
        warnings=warnings,
    )


def trace_stem(path: Path) -> str:
    """The name a file or folder stands for: the report's name, or the trace's."""
    if path.is_dir():
        return export_stem(path)
    return kineto_stem(path) if is_kineto_file(path) else path.stem


def _pairs(frame: pl.DataFrame | None) -> dict[str, str]:
    if frame is None or frame.is_empty():
        return {}
    frame = frame.unique(subset="name", keep="first", maintain_order=True)
    return dict(zip(frame["name"].cast(pl.String), frame["value"].cast(pl.String), strict=True))
