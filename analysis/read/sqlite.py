"""The SQLite reader: an ``nsys export --type sqlite`` file read through Arrow (ADBC's driver).

Files come from other people's machines: they are opened read-only (SQLite URI ``mode=ro``), and
the only SQL run is built here from the declared table specs in :mod:`analysis.read.specs`, with
identifiers quoted; nothing read from the file is ever executed.
ADBC's low-level API; each Arrow C stream goes straight into Polars (no pyarrow, no DB-API layer,
whose import pulls in pyarrow.dataset and pandas: about a second of start-up).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Collection, Iterator
from pathlib import Path

import adbc_driver_manager as adbc
import adbc_driver_sqlite
import polars as pl

from ..errors import TraceReadError
from .common import decode_text_columns, plan_columns, read_error, resolve_table, with_absent
from .specs import TableSpec


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sqlite_readonly_uri(path: Path) -> str:
    """An SQLite URI that opens ``path`` read-only (percent-escaped, so any file name works)."""
    return "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"


class SqliteExport:
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
            raise read_error(path, exc) from exc

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
            raise read_error(self.path, exc) from exc
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
        return resolve_table(spec, self.table_names)

    def _select(self, spec: TableSpec) -> tuple[str, list[str], list[str]] | None:
        """The SELECT for ``spec``'s declared columns, the optional ones it lacks, its text columns.

        Text columns are read as BLOBs and decoded here (:func:`decode_text_columns`): real
        exports hold invalid UTF-8 and NUL bytes in TEXT columns, which the Arrow driver would
        pass on unchecked and Polars would panic on.
        """
        table = self.resolve_table(spec)
        if table is None:
            return None
        chosen, absent_optional = plan_columns(spec, table, set(self.columns(table)), self.path)
        select: list[str] = []
        text: list[str] = []
        for col, source in chosen.items():
            if col in spec.text:
                text.append(col)
                select.append(f"CAST({_quote_ident(source)} AS BLOB) AS {_quote_ident(col)}")
            else:
                select.append(f"{_quote_ident(source)} AS {_quote_ident(col)}")
        return f"SELECT {', '.join(select)} FROM {_quote_ident(table)}", absent_optional, text

    def read(self, spec: TableSpec) -> pl.DataFrame | None:
        """Read the declared columns of ``spec``; None when the table is absent."""
        query = self._select(spec)
        if query is None:
            return None
        sql, absent_optional, text = query
        return with_absent(self._query(sql, text), absent_optional, spec.text)

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
                yield with_absent(decode_text_columns(frame, text), absent_optional, spec.text)

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
