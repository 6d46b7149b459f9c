"""The Parquet reader: a folder written by ``nsys export --type parquetdir`` (nsys 2024.6+).

Such a folder holds one Parquet file per table of the SQLite export, ``TABLE.parquet``, with the
SQLite export's table and column names (a table may also be a folder of ``*.parquet`` parts).
Tables are scanned lazily with Polars, only the declared columns of :mod:`analysis.read.specs`
(column pruning), and every value comes out with the type the SQLite reader gives it: integers
as Int64 (unsigned ones reinterpreted bit for bit, as SQLite stores them), reals as Float64,
text decoded leniently. The "row id" that readers slice tables by is the row's position.

Text columns holding invalid UTF-8 (Parquet allows it to be written, Polars refuses to read it)
are read through pyarrow as bytes instead and decoded like the SQLite reader's BLOB reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import polars as pl

from ..errors import TraceReadError
from .common import decode_text_columns, plan_columns, read_error, resolve_table, with_absent
from .specs import TableSpec

#: How folders written by nsys (``REPORT_pqtdir``, the name its export gives by default) or by
#: peers such as nsys-ai (``REPORT.parquetdir``) end; any folder with the tables counts too.
PARQUETDIR_SUFFIXES = (".parquetdir", "_pqtdir")
_KIND = "nsys parquetdir"
#: The table every nsys export has (see :func:`analysis.read.export.is_nsys_export`).
_MARKER = "StringIds"


def parquet_tables(folder: Path) -> dict[str, Path | str]:
    """Table name → what to scan (a file, or a glob over a table folder's parts)."""
    tables: dict[str, Path | str] = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return {}
    for entry in entries:
        if entry.name.startswith("."):
            continue
        if entry.suffix == ".parquet" and entry.is_file():
            tables[entry.stem] = entry
        elif entry.is_dir() and any(entry.glob("*.parquet")):
            tables.setdefault(entry.name, str(entry / "*.parquet"))
    return tables


def is_parquetdir(path: Path) -> bool:
    """Whether ``path`` is a folder of per-table Parquet files of one export."""
    return path.is_dir() and (path / f"{_MARKER}.parquet").exists()


def export_stem(path: Path) -> str:
    """The report name a parquetdir folder stands for (``X_pqtdir``, ``X.parquetdir`` → ``X``)."""
    for suffix in PARQUETDIR_SUFFIXES:
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            return path.name[: -len(suffix)]
    return path.name


class ParquetDirExport:
    """One parquetdir export; reads declared columns lazily, whole or in position slices."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.exists():
            raise TraceReadError(str(path), "no such file", _KIND)
        self._sources = parquet_tables(path)
        self.table_names = set(self._sources)

    def close(self) -> None:
        """Nothing stays open between reads."""

    def _scan(self, table: str) -> pl.LazyFrame:
        return pl.scan_parquet(self._sources[table])

    def columns(self, table: str) -> dict[str, str]:
        """Column name → Polars type of ``table``, from the Parquet footer."""
        try:
            schema = self._scan(table).collect_schema()
        except BaseException as exc:
            raise read_error(self.path / table, exc, _KIND) from exc
        return {name: str(dtype) for name, dtype in schema.items()}

    def resolve_table(self, spec: TableSpec) -> str | None:
        """The name ``spec``'s table has in this export, or None when it is absent."""
        return resolve_table(spec, self.table_names)

    def _plan(self, spec: TableSpec) -> tuple[str, dict[str, str], list[str]] | None:
        """``spec``'s table, declared column → stored column, and the optional ones absent."""
        table = self.resolve_table(spec)
        if table is None:
            return None
        chosen, absent_optional = plan_columns(spec, table, self.columns(table), self.path)
        return table, chosen, absent_optional

    def read(self, spec: TableSpec) -> pl.DataFrame | None:
        """Read the declared columns of ``spec``; None when the table is absent."""
        plan = self._plan(spec)
        if plan is None:
            return None
        table, chosen, absent = plan
        return self._finish(spec, self._collect(table, chosen, None), absent)

    def rowid_span(self, spec: TableSpec) -> tuple[int, int] | None:
        """``(0, rows)`` of ``spec``'s table (from the footers); None when absent or empty."""
        table = self.resolve_table(spec)
        if table is None:
            return None
        try:
            rows = int(self._scan(table).select(pl.len()).collect().item())
        except BaseException as exc:
            raise read_error(self.path / table, exc, _KIND) from exc
        return (0, rows) if rows else None

    def batches(
        self, spec: TableSpec, rows: int, *, rowids: tuple[int, int] | None = None
    ) -> Iterator[pl.DataFrame]:
        """The declared columns of ``spec`` in frames of about ``rows`` rows (none if absent).

        ``rowids``: only rows at positions ``[lo, hi)`` (a slice from :meth:`rowid_span`), in
        file order; each frame is a slice Polars reads from the row groups that hold it.
        """
        plan = self._plan(spec)
        if plan is None:
            return
        table, chosen, absent = plan
        span = rowids if rowids is not None else self.rowid_span(spec)
        if span is None:
            return
        lo, hi = span
        for offset in range(lo, hi, rows):
            frame = self._collect(table, chosen, (offset, min(rows, hi - offset)))
            if frame.height:
                yield self._finish(spec, frame, absent)

    def _collect(
        self, table: str, chosen: dict[str, str], window: tuple[int, int] | None
    ) -> pl.DataFrame:
        """The chosen columns (renamed) of ``table``, rows ``window`` = (offset, length)."""
        select = [pl.col(source).alias(col) for col, source in chosen.items()]
        try:
            frame = self._scan(table).select(select)
            if window is not None:
                frame = frame.slice(*window)
            return frame.collect()
        except pl.exceptions.ComputeError as exc:
            if "utf-8" not in str(exc).lower():
                raise read_error(self.path / table, exc, _KIND) from exc
        except BaseException as exc:
            raise read_error(self.path / table, exc, _KIND) from exc
        return self._collect_bytes(table, chosen, window)

    def _collect_bytes(
        self, table: str, chosen: dict[str, str], window: tuple[int, int] | None
    ) -> pl.DataFrame:
        """:meth:`_collect` through pyarrow, string columns as bytes (they hold invalid UTF-8)."""
        import pyarrow as pa
        import pyarrow.dataset as ds

        try:
            data = ds.dataset(str(self._sources[table]), format="parquet").to_table(
                columns=sorted(set(chosen.values()))
            )
            if window is not None:
                data = data.slice(*window)
            columns = {
                name: column.cast(pa.large_binary())
                if pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                else column
                for name, column in zip(data.column_names, data.columns, strict=True)
            }
            frame = pl.DataFrame(pa.table(columns))
        except BaseException as exc:
            raise read_error(self.path / table, exc, _KIND) from exc
        return frame.select(pl.col(source).alias(col) for col, source in chosen.items())

    def _finish(self, spec: TableSpec, frame: pl.DataFrame, absent: list[str]) -> pl.DataFrame:
        """Types as the SQLite reader gives them; text decoded; absent optionals as nulls."""
        casts = []
        for name, dtype in frame.schema.items():
            if name in spec.text:
                continue
            if dtype.is_integer() and dtype != pl.Int64:
                casts.append(pl.col(name).cast(pl.Int64, wrap_numerical=True))
            elif dtype == pl.Boolean:
                casts.append(pl.col(name).cast(pl.Int64))
            elif dtype.is_float() and dtype != pl.Float64:
                casts.append(pl.col(name).cast(pl.Float64))
        if casts:
            frame = frame.with_columns(casts)
        text = [c for c in spec.text if c in frame.columns]
        return with_absent(decode_text_columns(frame, text), absent, spec.text)
