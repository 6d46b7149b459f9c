"""Rows in any order: every output is the same whatever order an export stores its rows in.

From nsys 2025.6 the release notes say rows of the SQLite, Arrow and Parquet exports may come in
any order, "including timestamp order". Every real export in ../shared/traces (and the VeRL CPU
run) is copied with every table's rows inserted in another order — reversed, and two seeded
pseudo-random permutations (no primary keys, so rowids follow the new order) — and analyzed
(default phases and ``--all-ranges``, figures drawn); every output file must be byte for byte the
original's (``summary.json`` without its provenance and input paths).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from nvtxp_testkit import REPO, TRACES, output_digests

EXPORTS = [
    *sorted(TRACES.glob("*.sqlite")),
    *sorted((TRACES / "wild").glob("*.sqlite")),
    REPO / "tests/data/verl_cpu_run/verl_grpo.sqlite",
]
#: reversed, and two permutations of the rowids (a multiplicative hash modulo a prime)
ORDERS = ("reverse", "7", "1009")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def shuffled_copy(source: Path, target: Path, order: str) -> Path:
    """``source`` with every table's rows inserted in ``order``, as the file ``target``."""
    key = (
        "rowid DESC"
        if order == "reverse"
        else f"(rowid * 2654435761 + {int(order)} * 40503) % 4294967291, rowid"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(target)
    try:
        con.execute("ATTACH DATABASE ? AS src", (f"file:{source.resolve()}?mode=ro",))
        tables = [
            r[0]
            for r in con.execute(
                "SELECT name FROM src.sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%'"
            )
        ]
        for table in tables:
            info = con.execute("SELECT name, type FROM pragma_table_info(?, 'src')", (table,))
            # declared types only: no INTEGER PRIMARY KEY, so the rowid is the insertion order
            columns = ", ".join(f"{_q(name)} {kind}" for name, kind in info)
            con.execute(f"CREATE TABLE main.{_q(table)} ({columns})")
            con.execute(
                f"INSERT INTO main.{_q(table)} SELECT * FROM src.{_q(table)} ORDER BY {key}"
            )
        con.commit()
    finally:
        con.close()
    return target


def outputs(trace: Path, out: Path, all_ranges: bool) -> dict[str, object]:
    """Every file ``analyze`` writes, by name (:func:`nvtxp_testkit.output_digests`)."""
    return output_digests(trace, out, all_ranges=all_ranges)


@pytest.fixture(scope="module")
def differences(tmp_path_factory) -> dict[str, list[str]]:
    """Output name → the (order, mode, export) cases where it differs from the original's."""
    if not EXPORTS[0].exists():
        pytest.skip(f"{TRACES} not present")
    root = tmp_path_factory.mktemp("row_order")
    found: dict[str, list[str]] = {}
    for export in EXPORTS:
        copies = {o: shuffled_copy(export, root / "in" / o / export.name, o) for o in ORDERS}
        for all_ranges in (False, True):
            mode = "all" if all_ranges else "default"
            original = outputs(export, root / "out" / "original" / export.stem / mode, all_ranges)
            for order, copy in copies.items():
                out = root / "out" / order / export.stem / mode
                shuffled = outputs(copy, out, all_ranges)
                for name in sorted(original.keys() | shuffled.keys()):
                    if original.get(name) != shuffled.get(name):
                        found.setdefault(name, []).append(f"{order}/{mode}/{export.name}")
    return found


def test_every_output_is_independent_of_row_order(differences):
    assert not differences, differences


def test_gpu_activity_is_independent_of_row_order(differences):
    """``op_id`` numbers operations in one canonical order (analysis/run/spill.py ``ORDER``)."""
    assert "gpu_activity.parquet" not in differences, differences["gpu_activity.parquet"]


def test_warnings_are_independent_of_row_order(differences):
    """The 'none is a known phase' warning's examples: most frequent first, ties by name."""
    assert "summary:warnings" not in differences, differences["summary:warnings"]


def test_shuffled_copy_really_reorders(tmp_path):
    source = TRACES / "nsysai_h100_2gpu_1s.sqlite"
    if not source.exists():
        pytest.skip(f"{TRACES} not present")
    copy = shuffled_copy(source, tmp_path / "c.sqlite", "7")
    query = "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid"
    with sqlite3.connect(source) as a, sqlite3.connect(copy) as b:
        before, after = a.execute(query).fetchall(), b.execute(query).fetchall()
    assert sorted(before) == sorted(after)
    assert before != after
