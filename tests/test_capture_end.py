"""Ranges nsys closed at the capture's end are named in a warning, never taken at face value.

Seen on a real VeRL run under nsys 2022.4: the Ray actor that ran the trainer was killed at
shutdown before its last NVTX pops were flushed, and nsys ended its last ``step`` range at the
capture's duration (5.23 s traced for a step VeRL timed at 1.33 s).
"""

import shutil
import sqlite3

from nvtx_phases.analysis.normalize.events import nvtx_ranges
from nvtx_phases.analysis.read.export import read_export

CPU = "traces_sample/cpu_rl_step_nsys2022.4.sqlite"  # a real nsys 2022.4 capture


def test_a_range_ending_at_the_capture_duration_is_warned(tmp_path):
    cut = tmp_path / "cut.sqlite"
    shutil.copy(CPU, cut)
    with sqlite3.connect(cut) as con:
        (duration,) = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()
        assert duration == 369_848_438
        # the last step range (rowid 40, 105.69–120.27 ms) as nsys writes an unflushed pop
        con.execute("UPDATE NVTX_EVENTS SET end = ? WHERE rowid = 40", (duration,))
    ranges, warnings = nvtx_ranges(read_export(cut))
    assert [w for w in warnings if "end of the capture" in w] == [
        "cut: 1 NVTX range(s) end exactly at the end of the capture ('step'): nsys closes a "
        "range still open when the capture stops (its process exited before its last NVTX "
        "events were flushed, or it was still running), so their durations run to the "
        "capture's end, not to the range's own end"
    ]
    step = ranges.filter(ranges["start_ns"] == 105_691_689)
    assert step["end_ns"].to_list() == [369_848_438]


def test_the_unchanged_capture_has_no_such_warning():
    _, warnings = nvtx_ranges(read_export(CPU))
    assert not [w for w in warnings if "end of the capture" in w]
