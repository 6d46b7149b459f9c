"""Big benchmark exports with bounded memory: ``copies`` overlaid copies of a smaller export.

The synthetic generator builds a run in memory (about 0.75 KB per GPU operation: 7 GB for
10M operations), more than this shared machine should give a benchmark. A 10M-operation export
is instead made inside SQLite from the 1M one: every GPU operation and every runtime call is
repeated ``copies`` times with the same timestamps (copy ``j`` shifts ``correlationId`` by
``j × stride``, so each copy links to its own launching call), in start order like a real
export. Ranges, steps and phases stay those of the base run; each phase holds ``copies`` times
the operations, overlapping on their streams. Peak memory is SQLite's page cache.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

#: tables whose rows are repeated (operations and the calls that launch them)
REPEATED = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
)


def replicate(base: Path, out: Path, copies: int) -> Path:
    """Write ``out``: ``base`` with its operations and runtime calls repeated ``copies`` times."""
    tmp = out.with_name(out.name + ".partial")
    tmp.unlink(missing_ok=True)
    tmp.write_bytes(base.read_bytes())
    con = sqlite3.connect(tmp)
    try:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("PRAGMA synchronous = OFF")
        con.execute("PRAGMA temp_store = FILE")
        con.execute("PRAGMA cache_size = -262144")  # 256 MB
        present = [
            name
            for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if name in REPEATED
        ]
        stride = 1 + max(
            con.execute(f"SELECT coalesce(max(correlationId), 0) FROM {t}").fetchone()[0]
            for t in present
        )
        for table in present:
            _repeat_table(con, table, copies, stride)
        con.commit()
    finally:
        con.close()
    os.replace(tmp, out)
    return out


def _repeat_table(con: sqlite3.Connection, table: str, copies: int, stride: int) -> None:
    (create,) = con.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    columns = [row[1] for row in con.execute(f'PRAGMA table_info("{table}")')]
    picked = ", ".join(
        f"src.correlationId + c.j * {stride}" if col == "correlationId" else f'src."{col}"'
        for col in columns
    )
    names = ", ".join(f'"{col}"' for col in columns)
    con.execute(f'ALTER TABLE "{table}" RENAME TO src')
    con.execute(create)
    con.execute(
        f"WITH RECURSIVE c(j) AS (SELECT 0 UNION ALL SELECT j + 1 FROM c WHERE j < {copies - 1}) "
        f'INSERT INTO "{table}" ({names}) '
        f"SELECT {picked} FROM src, c ORDER BY src.rowid, c.j"
    )
    con.execute("DROP TABLE src")
