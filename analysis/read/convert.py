"""Write an SQLite export as a parquetdir folder, the layout ``nsys export --type parquetdir`` gives.

For nsys releases that cannot write it (before 2024.6), and for tests and benchmarks.

Every table, every column, rows in the file's order; types as the SQLite export declares them
(``INTEGER`` → int64, ``REAL`` → double, ``TEXT`` → string, ``BLOB`` → binary). Text is written
byte for byte as stored, invalid UTF-8 included, as nsys does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .sqlite import sqlite_readonly_uri


def _arrow_type(declared: str, pa: Any) -> Any:
    """The Arrow type for an SQLite declared type (SQLite's own affinity rules), None: as read."""
    kind = declared.upper()
    if "INT" in kind:
        return pa.int64()
    if "CHAR" in kind or "CLOB" in kind or "TEXT" in kind:
        return pa.large_string()
    if "REAL" in kind or "FLOA" in kind or "DOUB" in kind:
        return pa.float64()
    if "BLOB" in kind:
        return pa.large_binary()
    return None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sqlite_to_parquetdir(source: str | Path, target: str | Path) -> Path:
    """Write every table of the SQLite export ``source`` as ``target/TABLE.parquet``.

    ``target`` is replaced as a whole once every table is written.
    """
    import adbc_driver_sqlite.dbapi as dbapi
    import pyarrow as pa
    import pyarrow.parquet as pq

    source, target = Path(source), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with dbapi.connect(sqlite_readonly_uri(source)) as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            tables = [row[0] for row in cur.fetchall()]
            for table in tables:
                cur.execute(f"SELECT name, type FROM pragma_table_info('{table}')")
                declared = dict(cur.fetchall())
                select = ", ".join(
                    f"CAST({_quote(c)} AS BLOB) AS {_quote(c)}"
                    if _arrow_type(t, pa) == pa.large_string()
                    else _quote(c)
                    for c, t in declared.items()
                )
                cur.execute(f"SELECT {select} FROM {_quote(table)} ORDER BY rowid")
                data = cur.fetch_arrow_table()
                columns = {
                    name: _typed(data.column(name), _arrow_type(kind, pa), pa)
                    for name, kind in declared.items()
                }
                pq.write_table(pa.table(columns), work / f"{table}.parquet")
        if target.exists():
            shutil.rmtree(target)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _typed(column: Any, arrow_type: Any, pa: Any) -> Any:
    """``column`` as ``arrow_type``; text from BLOB reads reinterpreted without validation."""
    column = column.combine_chunks()
    if arrow_type is None:
        return column
    if column.null_count == len(column):  # the driver types an all-NULL column as int64
        return pa.nulls(len(column), arrow_type)
    if arrow_type == pa.large_string():
        return column.cast(pa.large_binary()).view(pa.large_string())
    return column.cast(arrow_type)
