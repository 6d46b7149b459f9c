"""The shared interval rules (analysis/intervals.py) against brute force over integer instants.

Each rule is implemented once and used by every output; here each is checked against a
computation written separately: the set of covered nanoseconds, enumerated one by one.
"""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from nvtx_phases.analysis.intervals import (
    segment_boundaries,
    segments_inside,
    segments_of,
    union_blocks,
    union_length,
    window_at,
)
from nvtx_phases.analysis.phase_paths import driver_phases

# small instants so that touching, nested, identical and zero-length intervals are frequent
_INTERVAL = st.tuples(
    st.sampled_from(["a", "b", None]), st.integers(0, 30), st.integers(0, 12)
).map(lambda t: (t[0], t[1], t[1] + t[2]))
_INTERVALS = st.lists(_INTERVAL, max_size=25)


def _frame(rows: list[tuple[str | None, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema={"g": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}, orient="row"
    )


def _covered(rows: list[tuple[str | None, int, int]]) -> dict[str | None, set[int]]:
    """Per group, every nanosecond [t, t + 1) some interval covers."""
    out: dict[str | None, set[int]] = {}
    for g, s, e in rows:
        out.setdefault(g, set()).update(range(s, e))
    return out


@settings(max_examples=300, deadline=None)
@given(_INTERVALS)
def test_union_length_is_the_covered_nanoseconds(rows):
    got = {g: n for g, n in union_length(_frame(rows), ["g"]).iter_rows()}
    assert got == {g: len(ns) for g, ns in _covered(rows).items()}


@settings(max_examples=300, deadline=None)
@given(_INTERVALS)
def test_union_blocks_are_the_connected_parts_of_the_union(rows):
    blocks = union_blocks(_frame(rows), ["g"])
    for g in {r[0] for r in rows}:
        mine = blocks.filter(pl.col("g").eq_missing(g)).select("start_ns", "end_ns").rows()
        # the textbook merge: in start order, an interval that starts at or before the
        # current part's end (touching included) extends it
        parts: list[tuple[int, int]] = []
        for s, e in sorted((s, e) for h, s, e in rows if h == g):
            if parts and s <= parts[-1][1]:
                parts[-1] = (parts[-1][0], max(parts[-1][1], e))
            else:
                parts.append((s, e))
        assert mine == parts
        assert sum(e - s for s, e in mine) == len(_covered(rows)[g])


def test_union_blocks_gap_zero_keeps_touching_intervals_apart_and_a_gap_merges():
    frame = _frame([("a", 0, 5), ("a", 5, 8), ("a", 10, 12), ("a", 2, 3)])
    assert union_blocks(frame, ["g"], gap_ns=0).select("start_ns", "end_ns").rows() == [
        (0, 5),
        (5, 8),
        (10, 12),
    ]
    assert union_blocks(frame, ["g"], gap_ns=3).select("start_ns", "end_ns").rows() == [(0, 12)]


@settings(max_examples=200, deadline=None)
@given(_INTERVALS.filter(bool))
def test_segments_inside_tile_each_interval(rows):
    frame = _frame(rows).with_row_index("i")
    bounds = segment_boundaries(frame["start_ns"], frame["end_ns"])
    spans = segments_of(bounds)
    inside = segments_inside(frame, bounds, ["i"]).join(spans, on="seg")
    for i, (_, s, e) in enumerate(rows):
        mine = inside.filter(pl.col("i") == i).sort("seg")
        covered = [
            t for a, b in mine.select("seg_start_ns", "seg_end_ns").rows() for t in range(a, b)
        ]
        assert covered == list(range(s, e))
        assert mine["first_seg"].to_list() == [k == 0 for k in range(mine.height)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=6), st.data())
def test_window_at_is_the_latest_window_started_and_still_open(spans, data):
    windows = pl.DataFrame(
        [(k, s, s + d) for k, (s, d) in enumerate(spans)],
        schema={"step": pl.Int64, "step_start_ns": pl.Int64, "step_end_ns": pl.Int64},
        orient="row",
    ).sort("step_start_ns", "step")
    instants = data.draw(st.lists(st.integers(-2, 45), max_size=10))
    got = window_at(windows, pl.Series(instants, dtype=pl.Int64)).to_list()
    ordered = windows.rows()
    expected = []
    for t in instants:
        started = [w for w in ordered if w[1] <= t]
        latest = started[-1] if started else None
        expected.append(latest[0] if latest is not None and t < latest[2] else None)
    assert got == expected


def test_driver_phases_are_the_window_rows_directly_inside_a_step():
    phases = pl.DataFrame(
        {
            "path": ["step", "step/gen", "step/gen/x", "gen/x", "step/reward", "step/gen"],
            "attribution": ["window"] * 5 + ["projection"],
            "step": [0, 0, 0, 0, 0, 0],
            "canonical": ["step", "gen", "x", "x", "reward", "gen"],
            "start_ns": [0, 1, 2, 3, 5, 1],
            "end_ns": [9, 4, 3, 4, 8, 4],
        }
    )
    assert driver_phases(phases)["canonical"].to_list() == ["gen", "reward"]
