"""Unions and the canonical order in whatever order rows come, against brute force (stdlib).

``union_length``/``union_blocks`` skip the sort on start when the frame is already in start
order, and ``canonical`` fully sorts only the rows tied on start: both must give what a plain
computation over the raw rows gives, in start order or not, with null keys, ties and (for the
blocks) an interval that ends before it starts.
"""

from __future__ import annotations

import random

import polars as pl
from nvtx_phases.analysis.intervals import union_blocks, union_length
from nvtx_phases.analysis.run.spill import ORDER, canonical


def _rows(seed: int, n: int = 400) -> list[tuple[str | None, int, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        start = rng.randrange(0, 2_000)
        rows.append((rng.choice(["g0", "g1", "g2", None]), start, start + rng.randrange(0, 40)))
    return rows


def _brute_blocks(rows: list[tuple[str | None, int, int]]) -> list[tuple[str | None, int, int]]:
    blocks: list[tuple[str | None, int, int]] = []
    groups = sorted({r[0] for r in rows}, key=lambda k: (k is not None, k or ""))
    for key in groups:
        spans = sorted((s, e) for k, s, e in rows if k == key)
        lo, hi = spans[0]
        for s, e in spans[1:]:
            if s < hi + 1:  # overlapping or touching: one block (gap 1)
                hi = max(hi, e)
            else:
                blocks.append((key, lo, hi))
                lo, hi = s, e
        blocks.append((key, lo, hi))
    return blocks


def _frame(rows: list[tuple[str | None, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=["g", "start_ns", "end_ns"], orient="row")


def test_union_blocks_and_length_match_brute_force_sorted_or_not() -> None:
    for seed in range(6):
        rows = _rows(seed)
        expected = _brute_blocks(rows)
        busy: dict[str | None, int] = {}
        for key, lo, hi in expected:
            busy[key] = busy.get(key, 0) + hi - lo
        for frame in (_frame(rows), _frame(rows).sort("start_ns")):
            assert union_blocks(frame, ["g"]).rows() == expected
            got = union_length(frame, ["g"])
            assert dict(got.rows()) == busy
            assert got["g"].to_list() == sorted(busy, key=lambda k: (k is not None, k or ""))


def test_union_blocks_with_an_interval_that_ends_before_it_starts() -> None:
    # the block's end is its own intervals' furthest end, not an earlier block's
    frame = _frame([("a", 0, 50), ("a", 60, 40), ("a", 100, 120)])
    assert union_blocks(frame, ["g"]).rows() == [("a", 0, 50), ("a", 60, 40), ("a", 100, 120)]


def test_canonical_is_one_sort_on_every_column() -> None:
    rng = random.Random(3)
    n = 3_000
    frame = pl.DataFrame(
        {
            "start_ns": [rng.randrange(0, 300) for _ in range(n)],  # many ties
            "end_ns": [rng.randrange(300, 310) for _ in range(n)],
            "device": [rng.choice(["0", "1"]) for _ in range(n)],
            "stream": [rng.choice([7, None]) for _ in range(n)],
            "correlation_id": [rng.randrange(0, 5) for _ in range(n)],
            "kind": "kernel",
            "gpid": 1,
            "pid": 1,
            "bytes": [rng.choice([None, 8]) for _ in range(n)],
            "op_class": "compute",
            "name": pl.Series([rng.choice(["b", "a"]) for _ in range(n)], dtype=pl.Categorical),
        }
    )
    columns = [c if isinstance(c, str) else "name" for c in ORDER]

    def key(row: dict) -> tuple:
        return tuple((row[c] is None, row[c] if row[c] is not None else 0) for c in columns)

    expected = sorted(frame.with_columns(pl.col("name").cast(pl.String)).rows(named=True), key=key)
    for given in (frame, frame.sort("start_ns")):
        got = canonical(given).with_columns(pl.col("name").cast(pl.String))
        assert [key(r) for r in got.rows(named=True)] == [key(r) for r in expected]
