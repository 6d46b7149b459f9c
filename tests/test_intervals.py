import polars as pl
from nvtx_phases.analysis.intervals import segment_index, split_at_segments, union_length
from polars.testing import assert_frame_equal


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


def test_union_does_not_carry_reach_from_one_group_into_the_next():
    # sorted by (seg, dev, start), each group's first interval starts before the end of the
    # group just before it: a running maximum leaking across groups would count it as covered
    frame = pl.DataFrame(
        {
            "seg": [1, 1, 2, None, 1, None],
            "dev": ["a", "b", "a", "a", "a", "a"],
            "start_ns": [0, 10, 5, 50, 200, 0],
            "end_ns": [100, 20, 6, 60, 210, 100],
        }
    )
    got = union_length(frame, ["seg", "dev"])
    assert got.rows() == [(None, "a", 100), (1, "a", 110), (1, "b", 10), (2, "a", 1)]


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


def test_busy_accumulator_carries_intervals_across_buckets():
    from nvtx_phases.analysis.attribute.intervals import BusyAccumulator

    acc = BusyAccumulator({"dev": pl.String})
    # bucket [.., 10): an interval running to 25 is counted to 10 and carried
    acc.add(pl.DataFrame({"dev": ["a", "a"], "start_ns": [0, 5], "end_ns": [25, 8]}), 10)
    # bucket [10, 20): overlaps the carried part [10, 25)
    acc.add(pl.DataFrame({"dev": ["a", "b"], "start_ns": [12, 15], "end_ns": [30, 40]}), 20)
    # last bucket, open-ended: nothing new; the carries close
    acc.add(pl.DataFrame(schema={"dev": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64}), None)
    got = acc.result().sort("dev")
    # a: [0, 30) = 30 (not 25 + 8 + 18); b: [15, 40) = 25
    assert got.to_dict(as_series=False) == {"dev": ["a", "b"], "busy_ns": [30, 25]}


def test_busy_blocks_merge_gaps_below_the_threshold():
    from nvtx_phases.analysis.energy.idle import busy_blocks

    ops = pl.DataFrame(
        {"device": ["g"] * 4, "start_ns": [0, 10, 14, 40], "end_ns": [10, 12, 20, 50]}
    )
    # touching intervals merge; a gap of 2 stays below 3 and merges; 20 apart does not
    assert busy_blocks(ops).rows() == [("g", 0, 12), ("g", 14, 20), ("g", 40, 50)]
    assert busy_blocks(ops, merge_gap_ns=3).rows() == [("g", 0, 20), ("g", 40, 50)]
    # merging blocks of two halves gives the blocks of the whole
    halves = pl.concat(
        [busy_blocks(ops.head(2), merge_gap_ns=3), busy_blocks(ops.tail(2), merge_gap_ns=3)]
    )
    assert busy_blocks(halves, merge_gap_ns=3).rows() == [("g", 0, 20), ("g", 40, 50)]
