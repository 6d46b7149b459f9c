"""The attribution core tells the truth: other threads' GPU work, counts that match times, and a
conservation check that can fail.

Every expected number is recomputed here from the files themselves: plain ``sqlite3`` (read-only
URI) over the CUPTI activity tables and NVTX_EVENTS, clipping and unions in numpy and plain
Python, or the Ray capture's operations as ``tests/test_synth_ray.py`` reads them back. The
conservation tests break the attribution on purpose and watch the check report it.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.attribute import operations
from nvtx_phases.analysis.attribute.phase_map import default_phase_map
from nvtx_phases.analysis.run.pipeline import analyze
from nvtx_phases.analysis.run.select import select_steps
from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray
from nvtxp_testkit import SAMPLES, shared_trace
from test_synth_ray import overlap, read_capture

OP_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
)
PROCESS_COLUMNS = ["process_gpu_ns", "process_gpu_busy_ns", "process_idle_ns", "process_n_devices"]
KEYS = ["trace", "pid", "step", "path", "phase", "attribution"]
ALL_RANGES = default_phase_map().with_all_ranges().with_strip_args()
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def raw_ops(path: Path) -> dict[str, np.ndarray]:
    """Every GPU operation of an export, straight from its tables.

    ``pid``: the process nsys records on the operation (globalPid bits 24..47); ``gtid``: the
    thread of the CUDA API call of the same process with the same correlationId (-1: none).
    """
    with connect(path) as con:
        present = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        (dupes,) = con.execute(
            "SELECT count(*) FROM (SELECT correlationId, globalTid >> 24 FROM "
            "CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1, 2 HAVING count(*) > 1)"
        ).fetchone()
        assert dupes == 0  # one call per (process, correlationId): the join below is exact
        rows: list[tuple] = []
        for table in OP_TABLES:
            if table in present:
                rows += con.execute(
                    f"SELECT (o.globalPid >> 24) & 16777215, o.deviceId, o.start, o.end, "
                    f"'{table}', coalesce(r.globalTid, -1) FROM {table} o "
                    "LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId "
                    "AND (r.globalTid >> 24) & 16777215 = (o.globalPid >> 24) & 16777215"
                ).fetchall()
    pid, device, start, end, table, gtid = (np.array(c) for c in zip(*rows, strict=True))
    assert (end >= start).all()
    # where a call was found, it is the operation's own process's: both definitions agree
    launched = gtid >= 0
    assert ((gtid[launched] >> 24) & 0xFFFFFF == pid[launched]).all()
    return {"pid": pid, "device": device, "start": start, "end": end, "table": table, "gtid": gtid}


def union(intervals: Iterable[tuple[int, int]]) -> int:
    """Length of a union of intervals, by a plain sort-merge."""
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total, reach = total + e - s, e
        elif e > reach:
            total, reach = total + e - reach, e
    return total


def process_truth(ops: dict[str, np.ndarray], pid: int, intervals: list[tuple[int, int]]) -> dict:
    """The process_* columns of a row whose ranges are ``intervals``, by brute force."""
    mine = ops["pid"] == pid
    start, end, device = ops["start"][mine], ops["end"][mine], ops["device"][mine]
    n_devices = len(set(device.tolist()))
    gpu = busy = idle = 0
    for s, e in intervals:
        cs, ce = np.maximum(start, s), np.minimum(end, e)
        inside = ce > cs
        gpu += int((ce - cs)[inside].sum())
        held = 0
        for d in set(device[inside].tolist()):
            on = inside & (device == d)
            held += union(zip(cs[on].tolist(), ce[on].tolist(), strict=True))
        busy += held
        idle += (e - s) * n_devices - held
    return {
        "process_gpu_ns": gpu,
        "process_gpu_busy_ns": busy,
        "process_idle_ns": idle,
        "process_n_devices": n_devices,
    }


def sql_ranges(path: Path) -> list[tuple[int, int, int]]:
    """(globalTid, start, end) of every closed NVTX range of an export."""
    with connect(path) as con:
        return sorted(
            con.execute(
                "SELECT globalTid, start, end FROM NVTX_EVENTS "
                "WHERE eventType IN (59, 60, 70, 71) AND end IS NOT NULL"
            ).fetchall()
        )


def check_process_columns(path: Path, result) -> int:
    """Every projection row's process_* columns against :func:`process_truth`; rows checked."""
    ops = raw_ops(path)
    ranges = result.ranges
    # the ranges behind the rows are the file's own NVTX ranges (single file: offset 0)
    assert sorted(ranges.select("gtid", "start_ns", "end_ns").rows()) == sql_ranges(path)
    no_step = pl.col("step").fill_null(-1)  # rows without a step join their ranges too
    rows = result.phases.filter(pl.col("attribution") == "projection").with_columns(no_step)
    by_row = (
        ranges.rename({"name": "phase"})
        .with_columns(no_step)
        .group_by(KEYS)
        .agg("start_ns", "end_ns")
    )
    joined = rows.join(by_row, on=KEYS, how="left")
    assert joined["start_ns_right"].null_count() == 0
    for row in joined.iter_rows(named=True):
        intervals = list(zip(row["start_ns_right"], row["end_ns_right"], strict=True))
        expected = process_truth(ops, row["pid"], intervals)
        assert {c: row[c] for c in PROCESS_COLUMNS} == expected, (row["pid"], row["path"])
        # the process holds at least the range's own operations inside it
        assert row["process_gpu_busy_ns"] >= row["gpu_busy_ns"]
    return joined.height


# --- other threads' GPU work: process_* columns and the warning -----------------------------


@pytest.fixture(scope="module")
def h100():
    path = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    return path, analyze([path], phase_map=ALL_RANGES, power_files=[])


def test_process_columns_of_every_h100_row_equal_sql(h100):
    path, result = h100
    assert check_process_columns(path, result) == result.phases.height > 100
    # aten::mul launches kernels that run after it: 0 busy of its own, the process's GPU full
    mul = result.phases.filter(pl.col("phase") == "aten::mul").sort("pid")
    assert mul["gpu_busy_ns"].to_list() == [0, 0]
    assert (mul["process_gpu_busy_ns"] > 0.99 * mul["wall_ns"]).all()


@pytest.mark.parametrize("chunk_ops", [2_000_000, 500], ids=["one-pass", "bucketed"])
def test_process_columns_of_the_mfu_export_equal_sql(chunk_ops, tmp_path):
    path = shared_trace("nsysai_mfu_2gpu_before.sqlite")
    with analyze(
        [path], phase_map=ALL_RANGES, power_files=[], chunk_ops=chunk_ops, spill_dir=tmp_path
    ) as result:
        assert (result.summary.n_buckets > 1) == (chunk_ops < 10_000)
        assert check_process_columns(path, result) == result.phases.height > 100


def test_process_columns_are_null_on_window_rows():
    with analyze([SAMPLE], power_files=[]) as result:
        window = result.phases.filter(pl.col("attribution") == "window")
        projection = result.phases.filter(pl.col("attribution") == "projection")
        assert window.height and projection.height
        assert all(window[c].null_count() == window.height for c in PROCESS_COLUMNS)
        assert all(projection[c].null_count() == 0 for c in PROCESS_COLUMNS)
        assert check_process_columns(SAMPLE, result) == projection.height


def test_launches_without_a_call_are_warned_with_their_numbers(h100):
    path, result = h100
    ops = raw_ops(path)
    dur = ops["end"] - ops["start"]
    total = int(dur.sum())
    for pid in (111, 112):
        lone = (ops["pid"] == pid) & (ops["gtid"] < 0)
        n, ns = int(lone.sum()), int(dur[lone].sum())
        line = (
            f"nsysai_h100_2gpu_1s: {n:,} operation(s), {ns / 1e6:.1f} ms "
            f"({100 * ns / total:.1f} % of GPU time) of pid {pid} have no launching CUDA API call"
        )
        assert sum(w.startswith(line) for w in result.warnings) == 1, line
        assert ns >= 0.05 * total


def test_a_thread_without_ranges_is_warned_and_its_work_stays_in_the_process(tmp_path):
    """Kernels of pid 144 re-launched (in a copy) from its pt_nccl_watchdg thread, no NVTX."""
    src = shared_trace("nsysai_mfu_2gpu_before.sqlite")
    copy = tmp_path / "mfu_other_thread.sqlite"
    shutil.copy(src, copy)
    with sqlite3.connect(copy) as con:
        (main,) = con.execute(
            "SELECT DISTINCT globalTid FROM NVTX_EVENTS WHERE (globalTid >> 24) & 16777215 = 144"
        ).fetchone()
        (other,) = con.execute(
            "SELECT t.globalTid FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
            "WHERE s.value = 'pt_nccl_watchdg' AND (t.globalTid >> 24) & 16777215 = 144"
        ).fetchone()
        (cut,) = con.execute(
            "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE (globalPid >> 24) & 16777215 = 144 "
            "ORDER BY start LIMIT 1 OFFSET (SELECT count(*) / 2 FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "WHERE (globalPid >> 24) & 16777215 = 144)"
        ).fetchone()
        con.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = ? WHERE globalTid = ? AND "
            "correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL "
            "WHERE (globalPid >> 24) & 16777215 = 144 AND start >= ?)",
            (other, main, cut),
        )
    ops = raw_ops(copy)
    dur = ops["end"] - ops["start"]
    moved = ops["gtid"] == other
    n, ns, total = int(moved.sum()), int(dur[moved].sum()), int(dur.sum())
    line = (
        f"mfu_other_thread: thread {other & 0xFFFFFF} (pt_nccl_watchdg) of pid 144 launched "
        f"{n:,} operation(s), {ns / 1e6:.1f} ms ({100 * ns / total:.1f} % of GPU time) and has "
        "no NVTX range: under projection they are unattributed; see the process_* columns"
    )
    with (
        analyze([src], phase_map=ALL_RANGES, power_files=[]) as before,
        analyze([copy], phase_map=ALL_RANGES, power_files=[]) as after,
    ):
        assert line in after.warnings and n > 900
        assert not any("pt_nccl_watchdg" in w for w in before.warnings)
        # the process's columns do not depend on which of its threads launched: unchanged
        cols = [*KEYS[1:], "wall_ns", *PROCESS_COLUMNS]  # the traces' labels differ
        assert before.phases.select(cols).equals(after.phases.select(cols))
        # while projection lost those kernels: exactly their time, from the top-level rows
        top = pl.col("level") == 0
        lost = (
            before.phases.filter(top)["kernel_ns"].sum()
            - after.phases.filter(top)["kernel_ns"].sum()
        )
        assert lost == ns
        assert after.summary.gpu.gpu_time_conserved
        assert check_process_columns(copy, after) == after.phases.height


# --- counts that match times --------------------------------------------------------------


def test_window_counts_hold_every_operation_whose_time_they_hold():
    with connect(SAMPLE) as con:
        driver = {
            (s, e)
            for (s, e) in con.execute(
                "SELECT start, end FROM NVTX_EVENTS WHERE (globalTid >> 24) & 16777215 = 1000 "
                "AND eventType IN (59, 60) AND end IS NOT NULL"
            )
        }
        kernels = np.array(
            con.execute("SELECT start, end, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
        )
    start, end, device = kernels[:, 0], kernels[:, 1], kernels[:, 2]
    with analyze([SAMPLE], power_files=[]) as result:
        window = result.phases.filter(pl.col("attribution") == "window")
        per_device = result.phase_devices
    straddled = 0
    for row in window.iter_rows(named=True):
        s, e = row["start_ns"], row["end_ns"]
        assert row["n_ranges"] == 1 and (s, e) in driver
        held = (np.minimum(end, e) > np.maximum(start, s)) | (
            (start == end) & (start >= s) & (start < e)
        )
        starts = (start >= s) & (start < e)
        assert row["n_kernels"] == int(held.sum())
        assert row["n_kernels_started"] == int(starts.sum())
        clipped = np.clip(np.minimum(end, e) - np.maximum(start, s), 0, None)
        assert row["kernel_ns"] == int(clipped.sum())
        assert (row["kernel_ns"] > 0) == (row["n_kernels"] > 0)  # no time without a count
        straddled += row["n_kernels"] - row["n_kernels_started"]
        for d in np.unique(device).tolist():
            (dev,) = per_device.filter(
                (pl.col("step") == row["step"])
                & (pl.col("path") == row["path"])
                & pl.col("device").str.ends_with(f":{d}")
            ).iter_rows(named=True)
            assert dev["n_kernels"] == int((held & (device == d)).sum())
            assert dev["n_kernels_started"] == int((starts & (device == d)).sum())
    assert straddled == 3  # the generation kernel of rank 0 runs into reward, each step
    # the started counts add up over the phases of a level: the kernels starting inside them
    steps = window.filter(pl.col("path") == "step")
    assert steps["n_kernels_started"].sum() == sum(
        int(((start >= s) & (start < e)).sum())
        for s, e in steps.select("start_ns", "end_ns").rows()
    )


@pytest.fixture(scope="module")
def ray(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ray")
    generate_ray(folder, RayConfig(power=False))
    return read_capture(folder), analyze(sorted(folder.glob("*.sqlite")), power_files=[])


def test_ray_capture_counts_graphs_and_kernels_where_their_time_lies(ray):
    cap, result = ray
    window = {
        (r["step"], r["path"]): r
        for r in result.phases.filter(pl.col("attribution") == "window").iter_rows(named=True)
    }
    assert len(window) == len(cap.driver)
    crossing = 0
    for step, path, s, e in cap.driver:
        row = window[(step, path)]
        for kind, count in (("kernel", "n_kernels"), ("graph", "n_graphs")):
            mine = [op for op in cap.ops if op.kind == kind]
            assert row[count] == sum(overlap(op, s, e) > 0 for op in mine), (path, kind)
            assert row[f"{count}_started"] == sum(s <= op.start < e for op in mine)
            assert row[f"{kind}_ns"] == sum(overlap(op, s, e) for op in mine)
            crossing += row[count] - row[f"{count}_started"]
    assert crossing > 0  # graph executions from gen run into the gap and reward


def test_ray_capture_process_columns_and_conservation(ray):
    cap, result = ray
    gpu = result.summary.gpu
    assert gpu.gpu_time_conserved and not any("not conserved" in w for w in result.warnings)
    assert gpu.total_gpu_ns == sum(op.end - op.start for op in cap.ops)
    ranges = result.ranges.rename({"name": "phase"})
    rows = result.phases.filter(pl.col("attribution") == "projection")
    assert rows.height == 12
    for row in rows.iter_rows(named=True):
        mine = [
            op for op in cap.ops if op.file == f"{row['trace']}.sqlite" and op.pid == row["pid"]
        ]
        spans = (
            ranges.filter(
                (pl.col("trace") == row["trace"])
                & (pl.col("pid") == row["pid"])
                & (pl.col("path") == row["path"])
                & (pl.col("step") == row["step"])
            )
            .select("start_ns", "end_ns")
            .rows()
        )
        devices = {op.device for op in mine}
        busy = sum(
            union(
                (max(op.start, s), min(op.end, e))
                for op in mine
                if op.device == d and overlap(op, s, e)
            )
            for s, e in spans
            for d in devices
        )
        assert row["process_gpu_ns"] == sum(overlap(op, s, e) for op in mine for s, e in spans)
        assert row["process_gpu_busy_ns"] == busy
        assert row["process_n_devices"] == len(devices) == 1
        assert row["process_idle_ns"] == sum(e - s for s, e in spans) - busy


# --- conservation: a check that can fail ---------------------------------------------------


def not_conserved(result, scheme: str) -> list[str]:
    return [w for w in result.warnings if w.startswith(f"GPU time not conserved under {scheme}")]


@pytest.mark.parametrize("chunk_ops", [2_000_000, 300], ids=["one-pass", "bucketed"])
def test_sample_conserves_both_schemes(chunk_ops, tmp_path):
    with analyze([SAMPLE], power_files=[], chunk_ops=chunk_ops, spill_dir=tmp_path) as result:
        gpu = result.summary.gpu
        assert gpu.gpu_time_conserved
        assert not not_conserved(result, "window") and not not_conserved(result, "projection")
        with connect(SAMPLE) as con:
            total = sum(
                con.execute(f"SELECT coalesce(sum(end - start), 0) FROM {t}").fetchone()[0]
                for t in OP_TABLES[:3]
            )
        assert gpu.total_gpu_ns == total
        # the projection side is the top-level rows' own time
        top = result.phases.filter((pl.col("attribution") == "projection") & (pl.col("level") == 0))
        times = ("kernel_ns", "memcpy_ns", "memset_ns", "graph_ns")
        assert gpu.projection_attributed_gpu_ns == top.select(pl.sum_horizontal(times).sum()).item()


def _broken_pairs(monkeypatch, how: str) -> dict:
    """projection_pairs that loses (or doubles) its first top-level pair, once per run."""
    original, seen = operations.projection_pairs, {}

    def broken(ops: pl.DataFrame, ranges: pl.DataFrame, *layout) -> pl.DataFrame:
        pairs = original(ops, ranges, *layout)
        top = pairs.join(ranges.filter(pl.col("level") == 0).select("rid"), on="rid")
        if seen or top.is_empty():
            return pairs
        victim = top.head(1)
        op = ops.filter(pl.col("op_id") == victim["op_id"][0])
        seen["dur"] = int((op["end_ns"] - op["start_ns"]).item())
        if how == "drop":
            return pairs.join(victim, on=["op_id", "rid"], how="anti")
        return pl.concat([pairs, victim])

    monkeypatch.setattr(operations, "projection_pairs", broken)
    return seen


def _broken_pieces(monkeypatch, how: str) -> dict:
    """window_pieces that loses (or doubles) one attributed piece, once per run."""
    original, seen = operations.window_pieces, {}

    def broken(ops: pl.DataFrame, boundaries: pl.Series, innermost: pl.DataFrame) -> pl.DataFrame:
        pieces = original(ops, boundaries, innermost).with_row_index("_row")
        held = pieces.filter(pl.col("rid").is_not_null() & (pl.col("overlap_ns") > 0))
        if seen or held.is_empty():
            return pieces.drop("_row")
        victim = held.head(1)
        seen["dur"] = int(victim["overlap_ns"].item())
        if how == "drop":
            return pieces.filter(pl.col("_row") != victim["_row"][0]).drop("_row")
        return pl.concat([pieces, victim]).drop("_row")

    monkeypatch.setattr(operations, "window_pieces", broken)
    return seen


@pytest.mark.parametrize("chunk_ops", [2_000_000, 300], ids=["one-pass", "bucketed"])
@pytest.mark.parametrize(
    ("breaker", "scheme"), [(_broken_pairs, "projection"), (_broken_pieces, "window")]
)
@pytest.mark.parametrize("how", ["drop", "double"])
def test_a_lost_or_doubled_operation_breaks_conservation(
    monkeypatch, tmp_path, breaker, scheme, how, chunk_ops
):
    seen = breaker(monkeypatch, how)
    with analyze([SAMPLE], power_files=[], chunk_ops=chunk_ops, spill_dir=tmp_path) as result:
        gap = seen["dur"] if how == "double" else -seen["dur"]
        assert gap != 0
        gpu = result.summary.gpu
        assert not gpu.gpu_time_conserved
        (line,) = not_conserved(result, scheme)
        assert line.endswith(f"({gap:+,} ns) — please report this trace")
        other = "window" if scheme == "projection" else "projection"
        assert not not_conserved(result, other)
        # the check this replaced summed two complementary filters of the per-operation rows:
        # it still balances here, so it could never have seen the broken attribution
        activity = result.gpu_activity.collect()
        path = "projection_path" if scheme == "projection" else "window_path"
        assert (
            activity.filter(pl.col(path).is_not_null())["dur_ns"].sum()
            + activity.filter(pl.col(path).is_null())["dur_ns"].sum()
            == activity["dur_ns"].sum()
        )
        # a step selection keeps the run's verdict
        assert not select_steps(result, ":").summary.gpu.gpu_time_conserved


def test_a_segment_left_without_its_innermost_phase_breaks_conservation(monkeypatch):
    original = operations.window_layout

    def broken(ranges: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
        boundaries, innermost = original(ranges)
        every_other = (pl.col("seg") % 2 == 0) & pl.col("rid").is_not_null()
        return boundaries, innermost.with_columns(
            pl.when(every_other).then(None).otherwise(pl.col("rid")).alias("rid")
        )

    monkeypatch.setattr(operations, "window_layout", broken)
    with analyze([SAMPLE], power_files=[]) as result:
        assert len(not_conserved(result, "window")) == 1
        assert not result.summary.gpu.gpu_time_conserved
        assert result.summary.gpu.attributed_gpu_ns + result.summary.gpu.unattributed_gpu_ns < (
            result.summary.gpu.total_gpu_ns
        )


def test_ranges_that_do_not_nest_hold_every_operation_they_enclose():
    """Found by the check: start/end ranges overlapping at one level (B runs past its parent A,
    C opens inside B) lost operations under both schemes until the as-of joins were fixed."""
    from nvtx_phases.analysis.normalize.events import OPS_SCHEMA, RANGES_SCHEMA, RUNTIME_SCHEMA
    from nvtxp_testkit import attribute_run

    gtid = (1 << 48) | (5 << 24) | 5
    spans = {"update_actor": (0, 10), "compute_log_prob": (5, 20), "compute_values": (12, 15)}
    ranges = pl.DataFrame(
        [
            {"trace": "t", "gtid": gtid, "pid": 5, "tid": 5, "start_ns": s, "end_ns": e}
            | {"name": name, "domain": "", "pushpop": False, "payload": None}
            for name, (s, e) in spans.items()
        ],
        schema=RANGES_SCHEMA,
    )
    calls = [(1, 2), (14, 18), (16, 17), (13, 14)]  # each op runs [call start, + 2]
    ops = pl.DataFrame(
        [
            {"trace": "t", "gpid": 5 << 24, "pid": 5, "device": "0", "stream": 7, "kind": "kernel"}
            | {"op_class": "compute", "name": "k", "start_ns": cs, "end_ns": cs + 2, "bytes": 0}
            | {"correlation_id": i}
            for i, (cs, _) in enumerate(calls, start=1)
        ],
        schema=OPS_SCHEMA,
    ).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("op_id"))
    runtime = pl.DataFrame(
        [
            {"trace": "t", "gtid": gtid, "pid": 5, "start_ns": cs, "end_ns": ce}
            | {"correlation_id": i}
            for i, (cs, ce) in enumerate(calls, start=1)
        ],
        schema=RUNTIME_SCHEMA,
    )
    result = attribute_run(ranges, ops, runtime, default_phase_map())
    held = {
        phase: sum(2 for cs, ce in calls if s <= cs and e >= ce) for phase, (s, e) in spans.items()
    }
    assert held == {"update_actor": 2, "compute_log_prob": 6, "compute_values": 2}
    got = dict(result.phases.select("phase", "kernel_ns").rows())
    assert got == held
    gpu = result.summary.gpu
    assert gpu.gpu_time_conserved and gpu.total_gpu_ns == 8
    assert gpu.projection_attributed_gpu_ns == 8  # every call lies in some range
    assert gpu.attributed_gpu_ns == 8  # every op runs inside some range (all-phase timeline)
    window = result.gpu_activity.collect().sort("op_id")["window_path"].to_list()
    # [14, 16] starts in C (level 1, started last); [16, 18] lies where only B is open
    assert [p.rsplit("/", 1)[-1] for p in window] == [
        "update_actor",
        "compute_values",
        "compute_log_prob",
        "compute_values",
    ]
