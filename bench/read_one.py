"""Read the declared columns of the big export tables with one engine; print JSON timings.

Run in its own process per engine so that peak RSS belongs to that engine alone. ``parallel``
is the benchmark's floor: the columns ``analyze`` reads (its own SELECTs) of every table it
reads, as rowid slices on every core, each thread with its own read-only connection.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import sqlite3
import sys
import time
from pathlib import Path

import polars as pl
from nvtx_phases.analysis.read import specs as T
from nvtx_phases.analysis.read.export import sqlite_readonly_uri

SPECS = (T.KERNELS, T.RUNTIME, T.NVTX_EVENTS, T.MEMCPY)


def _queries() -> list[str]:
    return [
        f"SELECT {', '.join(spec.required + spec.optional)} FROM {spec.name}"
        for spec in SPECS
        if spec is not T.NVTX_EVENTS
    ] + [
        "SELECT start, end, eventType, globalTid, text, textId, domainId, int64Value FROM NVTX_EVENTS"
    ]


def read_adbc(path: Path) -> int:
    """ADBC SQLite driver's DB-API → pyarrow Table → Polars (what analyze used before)."""
    import adbc_driver_sqlite.dbapi as adbc

    rows = 0
    with adbc.connect(sqlite_readonly_uri(path)) as con:
        for query in _queries():
            cur = con.cursor()
            cur.execute(query)
            rows += pl.from_arrow(cur.fetch_arrow_table()).height
            cur.close()
    return rows


def read_adbc_stream(path: Path) -> int:
    """ADBC's low-level API, each result's Arrow C stream straight into Polars (what analyze uses).

    No pyarrow and no DB-API layer (whose import pulls in pyarrow.dataset and pandas).
    """
    import adbc_driver_manager as adbc
    import adbc_driver_sqlite

    rows = 0
    with (
        adbc_driver_sqlite.connect(sqlite_readonly_uri(path)) as db,
        adbc.AdbcConnection(db) as con,
    ):
        for query in _queries():
            with adbc.AdbcStatement(con) as statement:
                statement.set_options(**{"adbc.sqlite.query.batch_rows": "131072"})
                statement.set_sql_query(query)
                stream, _ = statement.execute_query()
                rows += pl.DataFrame(stream).height
    return rows


def read_connectorx(path: Path) -> int:
    """Connectorx → Polars. It has no read-only open for SQLite: benchmarked here only."""
    uri = f"sqlite://{path.resolve()}"
    return sum(pl.read_database_uri(q, uri, engine="connectorx").height for q in _queries())


def read_python_rows(path: Path) -> int:
    """Baseline: the standard library's row-by-row cursor into Python tuples, then Polars."""
    rows = 0
    with sqlite3.connect(sqlite_readonly_uri(path), uri=True) as con:
        for query in _queries():
            cur = con.execute(query)
            names = [d[0] for d in cur.description]
            data = cur.fetchall()
            rows += pl.DataFrame(data, schema=names, orient="row", infer_schema_length=None).height
    return rows


def _slice_jobs(path: Path, pieces: int) -> list[tuple[str, tuple[int, int] | None]]:
    """(SELECT, rowid slice) for every table ``analyze`` reads, big ones cut in ``pieces``."""
    from nvtx_phases.analysis.read.export import Export

    export = Export(path)
    try:
        jobs: list[tuple[str, tuple[int, int] | None]] = []
        for spec in (*T.DATA_TABLES, *T.OPTIONAL_DATA_TABLES):
            query = export._select(spec)
            if query is None:
                continue
            span = export.rowid_span(spec)
            if span is None:
                jobs.append((query[0], None))
                continue
            lo, hi = span
            cuts = [lo + (hi - lo) * k // pieces for k in range(pieces + 1)]
            jobs += [(query[0], (a, b)) for a, b in itertools.pairwise(cuts) if b > a]
        return jobs
    finally:
        export.close()


def read_parallel(path: Path) -> int:
    """The floor: analyze's SELECTs, rowid slices on every core (ADBC → Arrow C stream → Polars)."""
    from concurrent.futures import ThreadPoolExecutor

    import adbc_driver_manager as adbc
    import adbc_driver_sqlite

    cores = os.cpu_count() or 1

    def read(job: tuple[str, tuple[int, int] | None]) -> int:
        sql, rowids = job
        if rowids is not None:
            sql += f" WHERE rowid >= {rowids[0]} AND rowid < {rowids[1]}"
        with (
            adbc_driver_sqlite.connect(sqlite_readonly_uri(path)) as db,
            adbc.AdbcConnection(db) as conn,
            adbc.AdbcStatement(conn) as statement,
        ):
            statement.set_options(**{"adbc.sqlite.query.batch_rows": "131072"})
            statement.set_sql_query(sql)
            stream, _ = statement.execute_query()
            return pl.DataFrame(stream).height

    jobs = _slice_jobs(path, 2 * cores)
    with ThreadPoolExecutor(max_workers=cores) as pool:
        return sum(pool.map(read, jobs))


ENGINES = {
    "parallel": read_parallel,
    "adbc-stream": read_adbc_stream,
    "adbc": read_adbc,
    "connectorx": read_connectorx,
    "sqlite3-rows": read_python_rows,
}


def main() -> None:
    """``python -m bench.read_one ENGINE FILE``: one timed read, JSON on stdout."""
    engine, path = sys.argv[1], Path(sys.argv[2])
    start = time.perf_counter()
    rows = ENGINES[engine](path)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"engine": engine, "rows": rows, "wall_s": wall, "peak_rss_mb": peak_mb}))


if __name__ == "__main__":
    main()
