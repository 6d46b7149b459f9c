"""``nvtx-phases timeline``: the Chrome trace-event file, checked by parsing it back.

Every slice is checked against the export itself, read with plain SQL (``sqlite3``, read-only):
one slice per NVTX range (name, start, duration to the ns, on its process and thread), one per
GPU operation on its GPU and stream, one counter event per power sample.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from nvtx_phases.analysis.cli import app
from nvtx_phases.analysis.jobs import analyze_to, open_run, timeline_to
from nvtx_phases.analysis.model import Analysis
from nvtx_phases.analysis.render.timeline.events import build_timeline, write_timeline
from nvtx_phases.analysis.render.timeline.ranges import NO_RANGES, longest_first, nest_lanes
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

runner = CliRunner()
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
CPU_STEP = SAMPLES / "cpu_rl_step_nsys2022.4.sqlite"  # a real nsys 2022.4 capture, CPU only
RANGE_TYPES = (59, 60, 70, 71)  # NVTX push/pop and start/end (ENUM_NSYS_EVENT_TYPE)
PID_BITS = 1 << 24
LIFT_FRESH = re.compile(r"^aten::lift_fresh(, |$)")

# --- reading the file back ------------------------------------------------------------------


def read(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def ns(value: float) -> int:
    """µs (the format's unit) → ns; the file must hold whole ns (3 decimals)."""
    assert abs(value * 1000 - round(value * 1000)) < 1e-3, value
    return round(value * 1000)


def names(doc: dict[str, Any]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """Process names by pid and thread names by (pid, tid), from the metadata events."""
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    return procs, threads


def plain(thread: str) -> str:
    """A thread track's name without the thread's own name: ``thread <tid>[ · …]``."""
    return re.sub(r"^(thread \d+) \(.*?\)(?= · |$)", r"\1", thread)


def track_list(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Processes in their sort order, each with its threads in theirs (:func:`plain` names)."""
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs, threads = names(doc)
    order = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    t_order = {
        (e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in meta
        if e["name"] == "thread_sort_index"
    }
    return [
        (procs[pid], [plain(threads[k]) for k in sorted(t_order, key=t_order.get) if k[0] == pid])
        for pid in sorted(procs, key=order.__getitem__)
    ]


def slices(doc: dict[str, Any], gpu: bool) -> list[dict[str, Any]]:
    """The slices on GPU processes (operations) or on the others (NVTX ranges)."""
    on_gpu = {pid for pid, name in names(doc)[0].items() if name.startswith("GPU ")}
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (e["pid"] in on_gpu) == gpu]


def range_slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return slices(doc, gpu=False)


def op_slices(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return slices(doc, gpu=True)


def drawn_ranges(doc: dict[str, Any]) -> Counter:
    """(file, pid, tid, name, start, dur) of every range slice, from its track's names."""
    procs, threads = names(doc)
    got: Counter = Counter()
    for e in range_slices(doc):
        trace, pid = re.fullmatch(r"(.+) pid (\d+)", procs[e["pid"]]).groups()
        tid = re.fullmatch(
            r"thread (\d+)( \(.*\))?( · overlapping ranges #\d+)?", threads[e["pid"], e["tid"]]
        )
        assert tid is not None, threads[e["pid"], e["tid"]]
        got[trace, int(pid), int(tid[1]), e["name"], ns(e["ts"]), ns(e["dur"])] += 1
    return got


def check_format(doc: dict[str, Any]) -> None:
    """Event fields as the format wants them, and slices on each track properly nested."""
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        assert e["ph"] in "XMCi", e
        if e["ph"] == "X":
            assert {"pid", "tid", "name", "ts", "dur"} <= set(e) and e["dur"] >= 0
            start = ns(e["ts"])
            tracks[e["pid"], e["tid"]].append((start, start + ns(e["dur"])))
        elif e["ph"] == "C":
            assert all(isinstance(v, int | float) for v in e["args"].values())
    for track, spans in tracks.items():
        stack: list[int] = []  # ends of the slices still open, innermost last
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (track, start, end, stack[-1])
            stack.append(end)


# --- the exports, read with plain SQL ---------------------------------------------------------


def query(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(sql).fetchall()


def sql_ranges(path: Path, rename: Any = None) -> Counter:
    """(file, pid, tid, name, start, dur) of every NVTX range of a single-file run."""
    rows = query(
        path,
        "SELECT e.globalTid, coalesce(e.text, s.value), e.start, e.end FROM NVTX_EVENTS e "
        f"LEFT JOIN StringIds s ON s.id = e.textId WHERE e.eventType IN {RANGE_TYPES}",
    )
    assert all(end is not None for *_, end in rows)  # none left open in these captures
    return Counter(
        (path.stem, g // PID_BITS % PID_BITS, g % PID_BITS, rename(n) if rename else n, s, e - s)
        for g, n, s, e in rows
    )


def sql_ops(path: Path) -> Counter:
    """(GPU, stream track, start, dur, kernel name) of every kernel, memcpy and memset."""
    rows = query(
        path,
        "SELECT deviceId, streamId, globalPid, start, end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL"
        " k JOIN StringIds s ON s.id = k.demangledName UNION ALL SELECT deviceId, streamId, "
        "globalPid, start, end, NULL FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT deviceId, "
        "streamId, globalPid, start, end, NULL FROM CUPTI_ACTIVITY_KIND_MEMSET",
    )
    pids = defaultdict(set)
    for device, _, gpid, *_ in rows:
        pids[device].add(gpid // PID_BITS % PID_BITS)
    return Counter(
        (
            f"GPU {path.stem}:{device}",  # these exports name no GPU (no TARGET_INFO_GPU)
            f"stream {stream}"
            + (f" · pid {gpid // PID_BITS % PID_BITS}" if len(pids[device]) > 1 else ""),
            start,
            end - start,
            name,
        )
        for device, stream, gpid, start, end, name in rows
    )


def drawn_ops(doc: dict[str, Any]) -> Counter:
    """As :func:`sql_ops`; a stream's extra track (operations overlapping) counts as the stream."""
    procs, threads = names(doc)
    return Counter(
        (
            procs[e["pid"]],
            re.sub(r" #\d+$", "", threads[e["pid"], e["tid"]]),
            ns(e["ts"]),
            ns(e["dur"]),
            e["name"] if e["args"].get("kind") == "kernel" else None,
        )
        for e in op_slices(doc)
    )


def timeline(tmp_path: Path, *args: str) -> tuple[dict[str, Any], str]:
    """Run the command; its file, read back and checked, and its output."""
    out = tmp_path / "t.json.gz"
    done = runner.invoke(app, ["timeline", *args, "-o", str(out)])
    assert done.exit_code == 0, done.output
    doc = read(out)
    check_format(doc)
    return doc, done.output


# --- real exports ------------------------------------------------------------------------------


def test_h100_export_one_slice_per_range_and_per_operation(tmp_path):
    trace = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    doc, output = timeline(tmp_path, str(trace), "--all-ranges")
    want = sql_ranges(trace)
    assert sum(want.values()) == 16_782
    assert drawn_ranges(doc) == want  # name, start, duration (ns) and thread of each range
    assert "16,782 of 16,782 NVTX ranges" in output
    ops = sql_ops(trace)
    assert sum(ops.values()) == 4368 and drawn_ops(doc) == ops
    # args: the range's own interval, and its phase-table row's totals, labelled as such
    first = min(range_slices(doc), key=lambda e: e["ts"])
    own, row = (
        first["args"]["this range"],
        first["args"]["phase-table row (totals over all its ranges)"],
    )
    assert own["start_ns"] == ns(first["ts"]) and own["dur_ns"] == ns(first["dur"])
    assert row["n_ranges"] >= 1 and row["wall_ns"] >= own["dur_ns"]
    assert {"gpu_busy_ns", "kernel_ns", "nccl_ns", "memcpy_ns"} <= set(row)


def strip(name: str) -> str:
    return re.split(r", [A-Za-z_]\w* = ", name, maxsplit=1)[0]


def test_mfu_export_lift_fresh_is_its_ranges_not_a_280_ms_span(tmp_path):
    # before: one slice per (pid, path) row, first start to last end: 280.48 ms for 11 µs
    trace = shared_trace("nsysai_mfu_2gpu_before.sqlite")
    doc, _ = timeline(tmp_path, str(trace), "--all-ranges", "--strip-args")
    want = sql_ranges(trace, rename=strip)
    assert drawn_ranges(doc) == want
    lift = [e for e in range_slices(doc) if e["name"] == "aten::lift_fresh"]
    raw = query(
        trace,
        "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        f"WHERE e.eventType IN {RANGE_TYPES} AND coalesce(e.text, s.value) LIKE 'aten::lift_fresh%'",
    )
    assert len(lift) == len(raw) == 34
    assert sum(ns(e["dur"]) for e in lift) == sum(e - s for s, e in raw) == 22_388  # 22 µs
    assert max(ns(e["dur"]) for e in lift) < 2_000
    assert drawn_ops(doc) == sql_ops(trace)


def test_cpu_capture_forward_and_backward_never_overlap(tmp_path):
    doc, _ = timeline(tmp_path, str(CPU_STEP), "--all-ranges")
    assert drawn_ranges(doc) == sql_ranges(CPU_STEP)
    fwd_bwd = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"])
        for e in range_slices(doc)
        if e["name"] in ("forward", "backward")
    )
    assert len(fwd_bwd) == 3 * 6  # per step: old_log_prob, ref, 2 micro-batches × (fwd, bwd)
    for (_, end, _), (start, _, _) in itertools.pairwise(fwd_bwd):
        assert end <= start  # one after the other, as they ran
    fwd = [e for e in range_slices(doc) if e["name"] == "forward"]
    assert max(e["dur"] for e in fwd) < 1300  # µs: each forward alone (the old slice: 3,468)


def test_start_end_range_of_a_real_export(tmp_path):
    trace = shared_trace("local_cpu_nvtx_nsys2023.4.sqlite")  # push/pop and start/end ranges
    doc, _ = timeline(tmp_path, str(trace), "--all-ranges")
    want = sql_ranges(trace)
    assert sum(n for k, n in want.items() if k[3] == "startend_range") == 3
    assert drawn_ranges(doc) == want


# --- the bundled sample: ranges, operations, power, steps; from traces and from a folder -------


def power_samples(result: Analysis) -> Counter:
    """The sampler's rows, put on the trace clock with the sampler's own clock marks."""
    marks = query(
        SAMPLE,
        "SELECT e.start, s.value FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE s.value LIKE 'nvtx_phases.power_clock mono_ns=%'",
    )
    offsets = {int(re.search(r"mono_ns=(\d+)", text)[1]) - t for t, text in marks}
    assert len(offsets) == 1
    (offset,) = offsets
    raw = pl.read_parquet(SAMPLES / "grpo_synthetic.power.parquet")
    return Counter(
        (f"GPU grpo_synthetic:{d}", mono - offset, w)
        for d, mono, w in raw.select("device", "mono_ns", "power_w").iter_rows()
    )


def union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start >= reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def check_sample(result: Analysis, doc: dict[str, Any]) -> None:
    """The sample's ranges, operations, power samples and steps are in ``doc``, one for one."""
    check_format(doc)
    assert drawn_ranges(doc) == sql_ranges(SAMPLE) and sum(drawn_ranges(doc).values()) == 54
    assert drawn_ops(doc) == sql_ops(SAMPLE) and len(op_slices(doc)) == 1349
    procs, _ = names(doc)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    power = Counter(
        (procs[e["pid"]], ns(e["ts"]), e["args"]["W"]) for e in counters if e["name"] == "power"
    )
    assert power == power_samples(result) and sum(power.values()) == 3966
    ops = result.gpu_activity.select("device", "start_ns", "end_ns").collect()
    for (device,), part in ops.partition_by("device", as_dict=True).items():
        busy = [
            e["args"]["fraction"]
            for e in counters
            if e["name"] == "GPU busy" and procs[e["pid"]] == f"GPU {device}"
        ]
        width = doc["otherData"]["busy_bin_ns"]
        assert sum(busy) * width == pytest.approx(
            union_ns(part.select("start_ns", "end_ns").rows())
        )
    steps = sorted((e["name"], ns(e["ts"])) for e in doc["traceEvents"] if e["ph"] == "i")
    assert steps == sorted(
        (name, t)
        for s, start, end in result.steps.rows()
        for name, t in ((f"step {s}", start), (f"step {s} end", end))
    )


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Analysis, dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("timeline") / "sample.json.gz"
    with open_run([SAMPLE]) as result:
        write_timeline(build_timeline(result, max_ops=200_000), out)
        yield result, read(out), out


def test_sample_timeline_has_every_range_op_sample_and_step(sample):
    result, doc, _ = sample
    check_sample(result, doc)
    assert doc["otherData"]["merged"] is None and doc["otherData"]["ranges_left_out"] is None
    step1 = next(
        e for e in range_slices(doc) if e["name"] == "step" and e["args"]["this range"]["step"] == 1
    )
    assert step1["ts"] * 1000 == 5_000_000  # µs on the run's clock: step 1 starts at 5 ms
    # a driver range's args: its own interval and its row's totals (window: every GPU's work)
    gen = next(e for e in range_slices(doc) if e["args"]["this range"]["path"] == "step/gen")
    row = result.phases.filter(
        pl.col("path") == "step/gen", pl.col("step") == gen["args"]["this range"]["step"]
    )
    totals = gen["args"]["phase-table row (totals over all its ranges)"]
    assert totals["gpu_busy_ns"] == row["gpu_busy_ns"].item() and totals["n_ranges"] == 1
    assert totals["energy_j"] == pytest.approx(row["energy_j"].item())


def test_sample_tracks_are_named_and_ordered(sample):
    _, doc, _ = sample
    streams = ["stream 7", "stream 13", "stream 15"]
    assert track_list(doc) == [
        ("grpo_synthetic pid 1000", ["thread 1000"]),
        ("grpo_synthetic pid 2000", ["thread 2000"]),
        ("grpo_synthetic pid 2001", ["thread 2001"]),
        ("GPU grpo_synthetic:0", streams),
        ("GPU grpo_synthetic:1", streams),
    ]


def test_analysis_folder_gives_the_same_file(sample, tmp_path):
    result, _, from_traces = sample
    with analyze_to([SAMPLE], tmp_path / "run", figures=False):
        pass
    done = timeline_to([tmp_path / "run"], tmp_path / "t.json.gz")  # reads gpu_activity.parquet
    assert done.n_gpu_ops == 1349 and done.n_ranges == done.n_ranges_drawn == 54
    assert done.notes == []
    assert read(done.path) == read(from_traces)
    check_sample(result, read(done.path))
    (tmp_path / "run" / "gpu_activity.parquet").unlink()  # then the operations are missing: said
    done = timeline_to([tmp_path / "run"], tmp_path / "t.json.gz")
    assert done.notes == [
        "GPU operations not shown: the analysis lacks their times; give its traces"
    ]
    doc = read(done.path)
    assert op_slices(doc) == [] and doc["otherData"]["gpu_ops"] == done.notes[0]


def test_folder_without_ranges_says_to_analyze_again(tmp_path):
    with analyze_to([SAMPLE], tmp_path / "run", figures=False):
        pass
    (tmp_path / "run" / "ranges.parquet").unlink()  # as an older version wrote it
    out = tmp_path / "t.json"
    done = runner.invoke(app, ["timeline", str(tmp_path / "run"), "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert "predates per-range output" in done.output and "re-run" in done.output
    doc = read(out)
    assert range_slices(doc) == [] and doc["otherData"]["ranges"] == NO_RANGES
    assert len(op_slices(doc)) == 1349


def test_merging_keeps_busy_time_and_says_so(sample, tmp_path):
    result, _, _ = sample
    ops = result.gpu_activity.select("device", "pid", "stream", "start_ns", "end_ns").collect()
    per_stream = ops.partition_by("device", "pid", "stream", as_dict=True)
    union = sum(union_ns(p.select("start_ns", "end_ns").rows()) for p in per_stream.values())
    doc, output = timeline(tmp_path, str(SAMPLE), "--max-ops", "100")
    assert "1,349 GPU operations > --max-ops 100: merged per stream" in output
    assert "--max-ops 1349 draws each operation" in output
    merged = doc["otherData"]["merged"]
    blocks = op_slices(doc)
    assert merged["n_ops"] == 1349 and len(blocks) == merged["n_blocks"] <= 100
    assert "--max-ops 1349 draws each operation" in doc["otherData"]["gpu_ops"]
    assert sum(b["args"]["n_ops"] for b in blocks) == 1349
    assert sum(b["args"]["busy_ns"] for b in blocks) == union
    assert sum(ns(b["dur"]) for b in blocks) >= union
    doc, _ = timeline(tmp_path, str(SAMPLE), "--merge-gap-us", "0")
    assert sum(ns(b["dur"]) for b in op_slices(doc)) == union


def test_max_ranges_leaves_out_the_shortest_and_says_so(tmp_path):
    doc, output = timeline(tmp_path, str(CPU_STEP), "--all-ranges", "--max-ranges", "20")
    every = sorted(sql_ranges(CPU_STEP).elements(), key=lambda k: (-k[5], k[4]))
    assert drawn_ranges(doc) == Counter(every[:20])  # the 20 longest (none of equal length)
    assert every[19][5] > every[20][5]
    left = doc["otherData"]["ranges_left_out"]
    assert left == {"n": 37, "longest_ns": every[20][5], "max_ranges": 20}
    assert "57 NVTX ranges > --max-ranges 20: the 20 longest drawn" in output
    assert "--max-ranges 57 draws every range" in output
    # every drawn range's enclosing ranges are drawn: the steps, gen, update_actor, …
    assert {e["name"] for e in range_slices(doc)} >= {"step", "gen", "update_actor"}


def test_partially_overlapping_ranges_get_an_extra_track(sample, tmp_path):
    result, _, _ = sample
    reward = result.ranges.filter(pl.col("path") == "step/reward", pl.col("step") == 1)
    straddle = reward.with_columns(  # a start/end range from inside reward to past its end
        pl.lit("straddle").alias("name"),
        pl.col("start_ns") + 1,
        pl.col("end_ns") + 1,
        pl.lit(10**6, pl.Int64).alias("rid"),
    )
    ranges = pl.concat([result.ranges, straddle])
    doc = read(
        write_timeline(
            build_timeline(replace(result, ranges=ranges), max_ops=10), tmp_path / "t.json"
        )
    )
    check_format(doc)
    _, threads = names(doc)
    drawn = next(e for e in range_slices(doc) if e["name"] == "straddle")
    assert plain(threads[drawn["pid"], drawn["tid"]]) == "thread 1000 · overlapping ranges #2"
    assert len(range_slices(doc)) == ranges.height == 55
    # where the per-range table names threads, the tracks say it
    named = replace(result, ranges=ranges.with_columns(thread_name=pl.lit("MainThread")))
    doc = read(write_timeline(build_timeline(named, max_ops=10), tmp_path / "t.json"))
    _, threads = names(doc)
    assert "thread 1000 (MainThread) · overlapping ranges #2" in threads.values()


def replace(result: Analysis, **changes: Any) -> Analysis:
    import dataclasses

    return dataclasses.replace(result, **changes)


def test_steps_keep_only_those_steps(sample, tmp_path):
    result, _, _ = sample
    doc, _ = timeline(tmp_path, str(SAMPLE), "--steps", "2:3")
    ranges = range_slices(doc)
    assert len(ranges) == 36  # the sample's 54 ranges are 18 per step
    assert {e["args"]["this range"]["step"] for e in ranges} == {2, 3}
    kept = result.gpu_activity.filter(pl.col("window_step").is_in([2, 3])).collect()
    assert len(op_slices(doc)) == kept.height


def test_ray_capture_processes_threads_and_shared_gpus(tmp_path):
    from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray

    # rollout servers marking generate_sequences on a thread other than their main one
    generate_ray(
        tmp_path / "ray",
        RayConfig(steps=1, decode_steps=16, kernels_per_phase=8, rollout_ranges=True),
    )
    done = timeline_to([tmp_path / "ray"], tmp_path / "ray.json")
    doc = read(done.path)
    check_format(doc)
    assert done.n_power_samples > 0
    per_process = Counter(k[:2] for k in drawn_ranges(doc).elements())
    want = Counter()
    for path in sorted((tmp_path / "ray").glob("*.sqlite")):
        want += Counter(k[:2] for k in sql_ranges(path).elements())
    assert per_process == want
    tracks = track_list(doc)
    assert tracks[:5] == [
        ("driver pid 1000", ["thread 1000"]),
        ("rollout_gpu0 pid 3000", ["thread 3001"]),
        ("rollout_gpu1 pid 3001", ["thread 3002"]),
        ("trainer_gpu0 pid 2000", ["thread 2000"]),
        ("trainer_gpu1 pid 2001", ["thread 2001"]),
    ]
    gpu0, streams = tracks[5]
    assert gpu0.startswith("GPU GPU-") and gpu0.endswith(" (NVIDIA H100 80GB HBM3)")
    assert streams == [
        *("stream 7 · pid 3000", "stream 15 · pid 3000"),
        *("stream 7 · pid 2000", "stream 13 · pid 2000", "stream 15 · pid 2000"),
    ]


# --- small parts -------------------------------------------------------------------------------


def test_nest_lanes_moves_partial_overlaps_aside():
    # [0,10] holds [2,5]; [4,12] overlaps both partly; [11,13] fits after [0,10]
    assert nest_lanes([0, 2, 4, 11], [10, 5, 12, 13]) == [0, 0, 1, 0]
    assert nest_lanes([0, 0, 10], [10, 10, 10]) == [0, 0, 0]


def test_longest_first_keeps_enclosing_ranges_first():
    ranges = pl.DataFrame(
        {"rid": [0, 1, 2, 3, 4], "start_ns": [0, 0, 10, 20, 30], "end_ns": [9, 9, 14, 24, 31]}
    )
    kept, longest_out = longest_first(ranges, 5)
    assert kept.equals(ranges) and longest_out is None
    kept, longest_out = longest_first(ranges, 3)
    assert kept["rid"].to_list() == [0, 1, 2] and longest_out == 4  # 2 before 3: earlier
    kept, longest_out = longest_first(ranges, 1)
    assert kept["rid"].to_list() == [0] and longest_out == 9  # of two equal, the enclosing one


def test_out_must_be_a_file(tmp_path):
    done = runner.invoke(app, ["timeline", str(SAMPLE), "--out", str(tmp_path)])
    assert done.exit_code == 2 and "is a folder" in done.output


def test_an_unwritable_out_is_named_not_its_temporary_file():
    done = runner.invoke(app, ["timeline", str(SAMPLE), "--out", "/proc/nvtx-phases-x.json"])
    assert done.exit_code == 2
    assert "--out /proc/nvtx-phases-x.json: cannot write it" in done.output
    assert ".tmp" not in done.output


def test_help_says_what_is_thinned():
    done = runner.invoke(app, ["timeline", "--help"], terminal_width=200)
    text = " ".join(done.output.split())
    assert "--max-ranges" in text and "--max-ops" in text
    assert "the shortest ranges are left out" in text and "merged into busy blocks" in text
