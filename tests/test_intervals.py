import polars as pl
from polars.testing import assert_frame_equal

from analysis.intervals import segment_index, split_at_segments, union_length


def test_union_counts_overlap_once_per_group():
    frame = pl.DataFrame(
        {
            "dev": ["a", "a", "a", "a", "b"],
            "start_ns": [0, 5, 20, 21, 0],
            "end_ns": [10, 12, 30, 25, 4],
        }
    )
    got = union_length(frame, ["dev"]).sort("dev")
    # a: [0,12) ∪ [20,30) = 12 + 10; b: 4
    assert_frame_equal(got, pl.DataFrame({"dev": ["a", "b"], "busy_ns": [22, 4]}))


def test_union_of_nested_and_touching_intervals():
    frame = pl.DataFrame({"g": [1, 1, 1], "start_ns": [0, 2, 10], "end_ns": [10, 3, 15]})
    assert union_length(frame, ["g"])["busy_ns"].to_list() == [15]


def test_split_pieces_add_up_to_each_interval():
    boundaries = pl.Series([10, 20, 30])
    ops = pl.DataFrame(
        {"op": [1, 2, 3, 4], "start_ns": [5, 12, 25, 20], "end_ns": [35, 18, 25, 20]}
    )
    pieces = split_at_segments(ops, boundaries)
    per_op = pieces.group_by("op").agg(pl.col("overlap_ns").sum()).sort("op")
    assert per_op["overlap_ns"].to_list() == [30, 6, 0, 0]
    # op 1 crosses all four segments: 5 + 10 + 10 + 5
    assert pieces.filter(pl.col("op") == 1).sort("seg")["overlap_ns"].to_list() == [5, 10, 10, 5]
    # a zero-length op at a boundary lies in the segment that starts there
    assert pieces.filter(pl.col("op") == 4)["seg"].to_list() == [2]
    assert pieces.filter(pl.col("first_piece")).height == 4


def test_segment_index_of_instants():
    boundaries = pl.Series([10, 20])
    assert segment_index(boundaries, pl.Series([0, 10, 15, 20, 99])).to_list() == [0, 1, 1, 2, 2]
