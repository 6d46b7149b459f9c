"""Read an Nsight Systems SQLite export into Polars frames through Arrow (ADBC's SQLite driver).

Files come from other people's machines: they are opened read-only (SQLite URI ``mode=ro``), and
the only SQL run is built here from the declared table specs in :mod:`analysis.read.specs`, with
identifiers quoted; nothing read from the file is ever executed.
ADBC's low-level API; each Arrow C stream goes straight into Polars (no pyarrow, no DB-API layer,
whose import pulls in pyarrow.dataset and pandas: about a second of start-up).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import adbc_driver_manager as adbc
import adbc_driver_sqlite
import polars as pl

from ..errors import MissingColumns, NotAnNsysExport, TraceReadError
from . import specs as T
from .specs import TableSpec


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


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sqlite_readonly_uri(path: Path) -> str:
    """An SQLite URI that opens ``path`` read-only (percent-escaped, so any file name works)."""
    return "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"


class Export:
    """One open, read-only export; reads declared columns as Arrow, whole or in batches."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise TraceReadError(str(path), "no such file")
        if path.is_dir():
            raise TraceReadError(str(path), "is a directory")
        try:
            self._db = adbc_driver_sqlite.connect(sqlite_readonly_uri(path))
            self.conn = adbc.AdbcConnection(self._db)
            self.table_names = set(
                self._query(
                    "SELECT CAST(name AS BLOB) AS name FROM sqlite_master WHERE type = 'table'",
                    ("name",),
                )["name"]
            )
        except BaseException as exc:  # the driver raises several DB-API classes: "unreadable"
            raise _read_error(path, exc) from exc

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()
        self._db.close()

    def _arrow(self, sql: str, batch_rows: int | None = None) -> pl.DataFrame:
        """The result of ``sql`` as one frame, read through the Arrow C stream interface."""
        try:
            with adbc.AdbcStatement(self.conn) as statement:
                if batch_rows is not None:  # fewer, bigger chunks (the driver's default: 1024)
                    statement.set_options(**{_BATCH_ROWS: str(batch_rows)})
                statement.set_sql_query(sql)
                stream, _ = statement.execute_query()
                frame = pl.DataFrame(stream)
        except BaseException as exc:
            raise _read_error(self.path, exc) from exc
        return frame

    def _query(self, sql: str, text_columns: Collection[str] = ()) -> pl.DataFrame:
        return decode_text_columns(self._arrow(sql, _WHOLE_BATCH_ROWS).rechunk(), text_columns)

    def columns(self, table: str) -> dict[str, str]:
        """Column name → declared type of ``table`` (a declared table, never a name from the file)."""
        info = self._query(
            "SELECT CAST(name AS BLOB) AS name, CAST(type AS BLOB) AS type "
            f"FROM pragma_table_info('{table}')",
            ("name", "type"),
        )
        return dict(zip(info["name"].cast(pl.String), info["type"].cast(pl.String), strict=True))

    def resolve_table(self, spec: TableSpec) -> str | None:
        """The name ``spec``'s table has in this export, or None when it is absent."""
        for candidate in (spec.name, *spec.alt_names):
            if candidate in self.table_names:
                return candidate
        return None

    def _select(self, spec: TableSpec) -> tuple[str, list[str], list[str]] | None:
        """The SELECT for ``spec``'s declared columns, the optional ones it lacks, its text columns.

        Text columns are read as BLOBs and decoded here (:func:`decode_text_columns`): real
        exports hold invalid UTF-8 and NUL bytes in TEXT columns, which the Arrow driver would
        pass on unchecked and Polars would panic on.
        """
        table = self.resolve_table(spec)
        if table is None:
            return None
        present = set(self.columns(table))
        select: list[str] = []
        text: list[str] = []
        missing_required: list[str] = []
        absent_optional: list[str] = []
        for col in (*spec.required, *spec.optional):
            source = next(
                (c for c in (col, *spec.aliases.get(col, ())) if c in present),
                None,
            )
            if source is None:
                (missing_required if col in spec.required else absent_optional).append(col)
                continue
            if col in spec.text:
                text.append(col)
                select.append(f"CAST({_quote_ident(source)} AS BLOB) AS {_quote_ident(col)}")
            else:
                select.append(f"{_quote_ident(source)} AS {_quote_ident(col)}")
        if missing_required:
            raise MissingColumns(str(self.path), table, missing_required)
        return f"SELECT {', '.join(select)} FROM {_quote_ident(table)}", absent_optional, text

    def read(self, spec: TableSpec) -> pl.DataFrame | None:
        """Read the declared columns of ``spec``; None when the table is absent."""
        query = self._select(spec)
        if query is None:
            return None
        sql, absent_optional, text = query
        return _with_absent(self._query(sql, text), absent_optional, spec.text)

    def rowid_span(self, spec: TableSpec) -> tuple[int, int] | None:
        """``(first, last + 1)`` rowid of ``spec``'s table; None when absent, empty or rowid-less.

        Two B-tree descents, not a scan: it lets readers split a big table into slices.
        """
        table = self.resolve_table(spec)
        if table is None:
            return None
        try:
            # one aggregate per query: SQLite answers a lone min() or max() of rowid from the
            # B-tree's ends, but scans the whole table for both in one query
            lo, hi = (
                self._query(f"SELECT {agg}(rowid) AS v FROM {_quote_ident(table)}")["v"][0]
                for agg in ("min", "max")
            )
        except TraceReadError:  # a WITHOUT ROWID table: read it whole
            return None
        return None if lo is None or hi is None else (int(lo), int(hi) + 1)

    def batches(
        self, spec: TableSpec, rows: int, *, rowids: tuple[int, int] | None = None
    ) -> Iterator[pl.DataFrame]:
        """The declared columns of ``spec`` in frames of about ``rows`` rows (none if absent).

        Big tables (kernels, runtime calls) stream this way so that no step holds the whole
        table twice (Arrow and Polars) or at all. ``rowids``: only rows with rowid in
        ``[lo, hi)`` (a slice from :meth:`rowid_span`), in file order.
        """
        query = self._select(spec)
        if query is None:
            return
        sql, absent_optional, text = query
        span = rowids if rowids is not None else self.rowid_span(spec)
        if span is None:  # empty, or a table without rowids: one read
            frames: Iterator[pl.DataFrame] = iter([self._arrow(sql, rows)])
        else:
            frames = self._keyset_pages(sql, span, rows)
        for frame in frames:
            if frame.height:
                yield _with_absent(decode_text_columns(frame, text), absent_optional, spec.text)

    def _keyset_pages(self, sql: str, span: tuple[int, int], rows: int) -> Iterator[pl.DataFrame]:
        """``sql``'s rows with rowid in ``span``, ``rows`` at a time (keyset pages), rowid order."""
        lo, hi = int(span[0]), int(span[1])
        select = sql.replace("SELECT ", "SELECT rowid AS __rowid, ", 1)
        while lo < hi:
            page = self._arrow(
                f"{select} WHERE rowid >= {lo} AND rowid < {hi} ORDER BY rowid LIMIT {int(rows)}",
                rows,
            )
            if page.height == 0:
                return
            lo = int(page["__rowid"][-1]) + 1
            yield page.drop("__rowid")
            if page.height < rows:
                return


_BATCH_ROWS = "adbc.sqlite.query.batch_rows"  # the driver's rows per Arrow batch
_WHOLE_BATCH_ROWS = 65_536  # for whole-table reads (metadata, NVTX)


def _with_absent(
    frame: pl.DataFrame, absent_optional: list[str], text: Collection[str] = ()
) -> pl.DataFrame:
    # Optional columns an older/newer schema lacks become typed nulls, so later stages see
    # one layout; the frames that matter record which were absent in RawTrace.warnings.
    if absent_optional:
        frame = frame.with_columns(
            pl.lit(None, dtype=pl.String if c in text else pl.Int64).alias(c)
            for c in absent_optional
        )
    return frame


def decode_text_columns(frame: pl.DataFrame, columns: Collection[str]) -> pl.DataFrame:
    """Decode BLOB-read text ``columns`` as UTF-8: invalid bytes become U+FFFD, NULs are dropped.

    The fast path is one validating cast; only a column that holds invalid UTF-8 is decoded
    value by value (files from other machines: binary device info, truncated strings).
    """
    fixed = []
    for name in columns:
        column = frame[name]
        if column.dtype == pl.String:
            decoded = column
        elif column.dtype == pl.Binary:
            try:
                decoded = column.cast(pl.String)
            except pl.exceptions.ComputeError:  # invalid UTF-8 somewhere in the column
                decoded = pl.Series(
                    name,
                    [None if v is None else v.decode("utf-8", "replace") for v in column],
                    dtype=pl.String,
                )
        else:  # all-null columns come back untyped; numbers stored in a TEXT column
            decoded = column.cast(pl.String)
        fixed.append(decoded.str.replace_all("\x00", "", literal=True))
    return frame.with_columns(fixed) if fixed else frame


_FATAL = (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)


def _read_error(path: Path, exc: BaseException) -> BaseException:
    """The :class:`TraceReadError` for a driver/Arrow/Polars failure while reading ``path``.

    Rust-side panics (``pyo3_runtime.PanicException``) derive from BaseException, not
    Exception; they mean unreadable data too. Interrupts and exits pass through unchanged.
    """
    if isinstance(exc, (*_FATAL, TraceReadError)):
        return exc
    return TraceReadError(str(path), _short(exc))


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for prefix in ("INVALID_ARGUMENT: ", "IO: ", "[SQLite] "):
        text = text.replace(prefix, "")
    return text


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
    """Read one ``nsys export --type sqlite`` file.

    Tables the capture did not collect (lazy exports omit them) are listed in
    ``missing_tables``; a file that is not an nsys export raises :class:`NotAnNsysExport`.
    ``streamed`` tables are only checked for presence: the caller reads them in batches
    (:meth:`Export.batches`).
    """
    path = Path(path)
    export = Export(path)
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
        label=label or path.stem,
        frames=frames,
        missing_tables=missing,
        meta=meta,
        session_start_utc_ns=session_start,
        clock_zero_utc_ns=clock_zero,
        duration_ns=int(details["duration"][0]) if details is not None and details.height else None,
        host=env.get("Hostname", meta.get("EXPORT_HOST", "")),
        warnings=warnings,
    )


def _pairs(frame: pl.DataFrame | None) -> dict[str, str]:
    if frame is None or frame.is_empty():
        return {}
    frame = frame.unique(subset="name", keep="first", maintain_order=True)
    return dict(zip(frame["name"].cast(pl.String), frame["value"].cast(pl.String), strict=True))
