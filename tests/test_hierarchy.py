import polars as pl
from nvtx_phases.analysis.attribute.hierarchy import build_hierarchy
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.normalize.events import RANGES_SCHEMA


def ranges(*rows: tuple) -> pl.DataFrame:
    """rows: (pid, tid, start, end, name[, payload])"""
    records = []
    for row in rows:
        pid, tid, start, end, name, *payload = row
        records.append(
            {
                "trace": "t",
                "gtid": (1 << 48) | (pid << 24) | tid,
                "pid": pid,
                "tid": tid,
                "start_ns": start,
                "end_ns": end,
                "name": name,
                "domain": "",
                "pushpop": True,
                "payload": payload[0] if payload else None,
            }
        )
    return pl.DataFrame(records, schema=RANGES_SCHEMA)


def table(h) -> list[tuple]:
    return h.phases.sort("start_ns", "level").select("name", "level", "path", "step").rows()


def test_nesting_paths_and_steps_from_enclosing_step_range():
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step"),
            (1, 1, 10, 50, "gen"),
            (1, 1, 20, 30, "weight_sync"),
            (1, 1, 50, 90, "update_actor"),  # starts exactly when gen ends: a sibling
            (1, 1, 200, 300, "step"),
            (1, 1, 200, 300, "gen"),  # same interval as its parent: nests inside
        ),
        default_phase_map(),
    )
    assert table(h) == [
        ("step", 0, "step", 0),
        ("gen", 1, "step/gen", 0),
        ("weight_sync", 2, "step/gen/weight_sync", 0),
        ("update_actor", 1, "step/update_actor", 0),
        ("step", 0, "step", 1),
        ("gen", 1, "step/gen", 1),
    ]
    assert h.warnings == []


def test_payload_wins_and_workers_get_step_from_driver_time_window():
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step", 7),
            (1, 1, 100, 200, "step", 8),
            (2, 2, 10, 40, "generate_sequences"),  # worker process, no payload
            (2, 2, 150, 160, "update_actor"),
            (2, 2, 500, 510, "update_actor"),  # after every step: no step
            (3, 3, 20, 30, "compute_log_prob", 42),  # its own payload wins
        ),
        default_phase_map(),
    )
    steps = dict(h.phases.select("name", "step").filter(pl.col("name") != "update_actor").rows())
    assert steps == {"step": 8, "generate_sequences": 7, "compute_log_prob": 42}
    assert h.phases.filter(pl.col("name") == "update_actor").sort("start_ns")["step"].to_list() == [
        8,
        None,
    ]
    assert h.steps.rows() == [(7, 0, 100), (8, 100, 200)]


def test_non_phase_ranges_are_ignored_unless_all_ranges():
    rows = ranges((1, 1, 0, 100, "step"), (1, 1, 5, 95, "aten::mm"), (1, 1, 10, 20, "gen"))
    assert table(build_hierarchy(rows, default_phase_map())) == [
        ("step", 0, "step", 0),
        ("gen", 1, "step/gen", 0),
    ]
    assert table(build_hierarchy(rows, default_phase_map().with_all_ranges())) == [
        ("step", 0, "step", 0),
        ("aten::mm", 1, "step/aten::mm", 0),
        ("gen", 2, "step/aten::mm/gen", 0),
    ]


def test_zero_length_ranges_and_simultaneous_starts_nest_longest_first():
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step"),
            (1, 1, 40, 40, "adv"),
            (1, 1, 50, 50, "gen"),
            (1, 1, 50, 60, "reward"),
        ),
        default_phase_map(),
    )
    # timestamps cannot tell "gen pushed and popped, then reward pushed" from "reward pushed,
    # then gen pushed and popped"; the documented rule nests the shorter range inside
    assert table(h) == [
        ("step", 0, "step", 0),
        ("adv", 1, "step/adv", 0),
        ("reward", 1, "step/reward", 0),
        ("gen", 2, "step/reward/gen", 0),
    ]


def test_overlapping_steps_are_warned_only_within_one_process():
    # pid 1 marks step 2 (on another thread) before its step 1 has ended: a real overlap
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step", 1),
            (1, 2, 90, 200, "step", 2),
            (1, 1, 95, 99, "gen"),
        ),
        default_phase_map(),
    )
    assert h.warnings == [
        "1 step(s) start before the previous step ends, within one process (trace t pid 1: "
        "step 2); ranges of that process in the overlap count toward the later step"
    ]
    assert dict(h.phases.select("name", "step").filter(pl.col("name") == "gen").rows()) == {
        "gen": 2
    }

    # steps of different processes overlapping in time are normal: no warning; each process's
    # ranges take its own steps (pid 2's generate_sequences precedes its only step: no step)
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step", 1),
            (2, 2, 90, 200, "step", 2),
            (2, 2, 95, 99, "gen"),
            (2, 2, 50, 60, "generate_sequences"),
        ),
        default_phase_map(),
    )
    assert h.warnings == []
    assert h.phases.sort("start_ns").select("pid", "name", "step").rows() == [
        (1, "step", 1),
        (2, "generate_sequences", None),
        (2, "step", 2),
        (2, "gen", 2),
    ]

    # without payloads, steps are numbered per process: both processes' first step is step 0
    h = build_hierarchy(
        ranges((1, 1, 0, 100, "step"), (2, 2, 90, 200, "step")), default_phase_map()
    )
    assert h.steps.rows() == [(0, 0, 200)]
    assert h.warnings == []


def test_missing_steps_are_warned():
    h = build_hierarchy(ranges((1, 1, 0, 100, "gen")), default_phase_map())
    assert h.warnings == [
        "no step range found (names: step); phases have no step index unless their NVTX "
        "payload carries one"
    ]
    assert h.phases["step"].to_list() == [None]


def test_staggered_processes_take_steps_from_their_own_step_ranges():
    # torchrun-like: two processes mark their own steps 0, 1 without payload; pid 2 runs 30 ns
    # behind pid 1. pid 3 (a worker) marks no steps and takes the step window of the run.
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step"),
            (1, 1, 10, 40, "gen"),
            (1, 1, 100, 200, "step"),
            (1, 1, 110, 150, "gen"),
            (2, 2, 30, 130, "step"),
            (2, 2, 40, 100, "gen"),
            (2, 2, 100, 125, "update_actor"),  # starts in pid 1's step 1, inside its own step 0
            (2, 5, 120, 128, "compute_log_prob"),  # another thread of pid 2: still its step 0
            (2, 2, 130, 230, "step"),
            (2, 2, 135, 200, "gen"),
            (2, 2, 240, 250, "update_actor"),  # after pid 2's last step: no step
            (3, 3, 20, 30, "generate_sequences"),  # only step 0's window holds t=20
            (3, 3, 115, 118, "compute_log_prob"),  # both windows hold t=115: the later step
            (3, 3, 210, 220, "update_critic"),  # only step 1's window holds t=210
            (3, 3, 250, 260, "update_critic"),  # after every window: no step
        ),
        default_phase_map(),
    )
    assert h.phases.sort("pid", "start_ns").select("pid", "path", "step").rows() == [
        (1, "step", 0),
        (1, "step/gen", 0),
        (1, "step", 1),
        (1, "step/gen", 1),
        (2, "step", 0),
        (2, "step/gen", 0),
        (2, "step/update_actor", 0),
        (2, "compute_log_prob", 0),
        (2, "step", 1),
        (2, "step/gen", 1),
        (2, "update_actor", None),
        (3, "generate_sequences", 0),
        (3, "compute_log_prob", 1),
        (3, "update_critic", 1),
        (3, "update_critic", None),
    ]
    # the windows table is unchanged: per step index, the union over processes
    assert h.steps.rows() == [(0, 0, 130), (1, 100, 230)]
    assert h.warnings == [
        "1 phase range(s) of processes without step ranges start where the time windows of two "
        "steps overlap (steps of different processes staggered in time); each counts toward the "
        "step that started last"
    ]


def test_ranges_past_their_own_process_step_end_are_warned():
    # pid 1's gen runs past pid 1's step 0 (ends 100) but not past step 0's window (ends 130)
    h = build_hierarchy(
        ranges(
            (1, 1, 0, 100, "step"),
            (1, 2, 50, 120, "gen"),
            (2, 2, 30, 130, "step"),
        ),
        default_phase_map(),
    )
    assert h.phases.sort("start_ns").select("pid", "name", "step").rows() == [
        (1, "step", 0),
        (2, "step", 0),
        (1, "gen", 0),
    ]
    assert h.warnings == [
        "1 phase range(s) run past the end of their step; each counts in the step it starts in"
    ]


def test_improperly_nested_start_end_ranges_are_counted():
    h = build_hierarchy(
        ranges((1, 1, 0, 100, "step"), (1, 1, 10, 60, "gen"), (1, 1, 50, 80, "reward")),
        default_phase_map(),
    )
    assert any("1 phase range(s) overlap" in w for w in h.warnings)
