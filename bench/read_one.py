"""Read the declared columns of the big export tables with one engine; print JSON timings.

Run in its own process per engine so that peak RSS belongs to that engine alone.
"""

from __future__ import annotations

import json
import resource
import sqlite3
import sys
import time
from pathlib import Path

import polars as pl

from analysis.read import specs as T
from analysis.read.export import sqlite_readonly_uri

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
    """ADBC SQLite driver → Arrow → Polars (what analysis.read.export uses)."""
    import adbc_driver_sqlite.dbapi as adbc

    rows = 0
    with adbc.connect(sqlite_readonly_uri(path)) as con:
        for query in _queries():
            cur = con.cursor()
            cur.execute(query)
            rows += pl.from_arrow(cur.fetch_arrow_table()).height
            cur.close()
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


ENGINES = {"adbc": read_adbc, "connectorx": read_connectorx, "sqlite3-rows": read_python_rows}


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
