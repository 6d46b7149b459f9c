"""``nvtx-phases timeline``: the Chrome trace-event file, checked by parsing it back."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from nvtxp_testkit import SAMPLES, shared_trace
from typer.testing import CliRunner

from analysis.cli import app
from analysis.jobs import analyze_to, open_run, timeline_to
from analysis.model import Analysis
from analysis.render.timeline import build_timeline, nest_lanes, write_timeline

runner = CliRunner()
SAMPLE = SAMPLES / "grpo_synthetic.sqlite"
PHASE_CATS = ("window", "projection")


def read(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def ns(value: float) -> int:
    return round(value * 1000)


def names(doc: dict[str, Any]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    """Process names by pid and thread names by (pid, tid), from the metadata events."""
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    return procs, threads


def track_list(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """Processes in their sort order, each with its threads in theirs."""
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    procs, threads = names(doc)
    order = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    t_order = {
        (e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in meta
        if e["name"] == "thread_sort_index"
    }
    return [
        (procs[pid], [threads[k] for k in sorted(t_order, key=t_order.get) if k[0] == pid])
        for pid in sorted(procs, key=order.__getitem__)
    ]


def slices(doc: dict[str, Any], phases: bool) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (e["cat"] in PHASE_CATS) == phases]


def assert_nested(doc: dict[str, Any]) -> None:
    """On every (pid, tid), slices nest or are disjoint: never a partial overlap."""
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            start = ns(e["ts"])
            tracks[e["pid"], e["tid"]].append((start, start + ns(e["dur"])))
    for track, spans in tracks.items():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (track, start, end, stack[-1])
            stack.append(end)


def union_ns(spans: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(spans):
        if reach is None or start >= reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def check_run(result: Analysis, doc: dict[str, Any]) -> None:
    """Phases, operations, counters and steps of ``result`` are in ``doc``, one for one."""
    assert_nested(doc)
    procs, _ = names(doc)
    gpu = {d.device: f"GPU {d.device} ({d.gpu_name})" for d in result.summary.devices if d.gpu_name}
    # every phase row: exactly one slice (name + start), its length, on its own process's track
    got = Counter(
        (procs[e["pid"]], e["name"], ns(e["ts"]), ns(e["dur"])) for e in slices(doc, True)
    )
    want = Counter(
        (f"{t} pid {p}", name, start, end - start)
        for t, p, name, start, end in result.phases.select(
            "trace", "pid", "phase", "start_ns", "end_ns"
        ).iter_rows()
    )
    assert got == want
    # every GPU operation: one slice on its GPU's process
    ops = result.gpu_activity.select("device", "start_ns", "end_ns").collect()
    assert ops.height == result.summary.gpu.n_gpu_ops
    got_ops = Counter((procs[e["pid"]], ns(e["ts"]), ns(e["dur"])) for e in slices(doc, False))
    want_ops = Counter((gpu.get(d, f"GPU {d}"), s, e - s) for d, s, e in ops.iter_rows())
    assert got_ops == want_ops
    # power: one counter event per sample, same values; busy fraction integrates to busy time
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    power = [
        (procs[e["pid"]], ns(e["ts"]), e["args"]["W"]) for e in counters if e["name"] == "power"
    ]
    samples = result.power_samples
    want_power = [] if samples is None else samples.select("device", "t_ns", "power_w").rows()
    assert sorted(power) == sorted((gpu.get(d, f"GPU {d}"), t, w) for d, t, w in want_power)
    width = doc["otherData"]["busy_bin_ns"]
    for device, part in ops.partition_by("device", as_dict=True).items():
        busy = [
            e["args"]["fraction"]
            for e in counters
            if e["name"] == "GPU busy" and procs[e["pid"]] == gpu.get(device[0], f"GPU {device[0]}")
        ]
        assert sum(busy) * width == pytest.approx(
            union_ns(part.select("start_ns", "end_ns").rows())
        )
    # steps: an instant at each start and end
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


def test_sample_timeline_has_every_phase_op_sample_and_step(sample):
    result, doc, _ = sample
    check_run(result, doc)
    assert len(slices(doc, True)) == result.phases.height == 54
    assert len(slices(doc, False)) == 1349
    assert doc["otherData"]["n_power_samples"] == 3966 and doc["otherData"]["merged"] is None
    step1 = next(e for e in slices(doc, True) if e["name"] == "step" and e["args"]["step"] == 1)
    assert step1["ts"] * 1000 == 5_000_000  # µs on the run's clock: step 1 starts at 5 ms


def test_sample_tracks_are_named_and_ordered(sample):
    _, doc, _ = sample
    streams = ["stream 7", "stream 13", "stream 15"]
    assert track_list(doc) == [
        ("grpo_synthetic pid 1000", ["driver phases"]),
        ("grpo_synthetic pid 2000", ["phases"]),
        ("grpo_synthetic pid 2001", ["phases"]),
        ("GPU grpo_synthetic:0", streams),
        ("GPU grpo_synthetic:1", streams),
    ]


def test_analysis_folder_gives_the_same_file(sample, tmp_path):
    _, _, from_traces = sample
    with analyze_to([SAMPLE], tmp_path / "run", figures=False):
        pass
    done = timeline_to([tmp_path / "run"], tmp_path / "t.json.gz")  # reads gpu_activity.parquet
    assert done.n_gpu_ops == 1349 and done.notes == []
    assert read(done.path) == read(from_traces)
    (tmp_path / "run" / "gpu_activity.parquet").unlink()  # then the operations are missing: said
    done = timeline_to([tmp_path / "run"], tmp_path / "t.json.gz")
    assert done.notes == [
        "GPU operations not shown: the analysis lacks their times; give its traces"
    ]
    doc = read(done.path)
    assert slices(doc, False) == [] and doc["otherData"]["gpu_ops"] == done.notes[0]


def test_merging_keeps_busy_time_and_says_so(sample, tmp_path):
    result, _, _ = sample
    ops = result.gpu_activity.select("device", "pid", "stream", "start_ns", "end_ns").collect()
    per_stream = ops.partition_by("device", "pid", "stream", as_dict=True)
    union = sum(union_ns(p.select("start_ns", "end_ns").rows()) for p in per_stream.values())
    out = tmp_path / "merged.json"
    done = runner.invoke(app, ["timeline", str(SAMPLE), "--out", str(out), "--max-ops", "100"])
    assert done.exit_code == 0, done.output
    assert "1,349 GPU operations > --max-ops 100: merged per stream" in done.output
    doc = read(out)
    merged = doc["otherData"]["merged"]
    blocks = slices(doc, False)
    assert merged["n_ops"] == 1349 and len(blocks) == merged["n_blocks"] <= 100
    assert "merged per stream" in doc["otherData"]["gpu_ops"]
    assert sum(b["args"]["n_ops"] for b in blocks) == 1349
    assert sum(b["args"]["busy_ns"] for b in blocks) == union
    assert sum(ns(b["dur"]) for b in blocks) >= union
    assert_nested(doc)
    exact = tmp_path / "gap0.json.gz"
    done = runner.invoke(app, ["timeline", str(SAMPLE), "-o", str(exact), "--merge-gap-us", "0"])
    assert done.exit_code == 0, done.output
    assert sum(ns(b["dur"]) for b in slices(read(exact), False)) == union


def test_real_h100_export(tmp_path):
    trace = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    out = tmp_path / "h100.json.gz"
    done = runner.invoke(app, ["timeline", str(trace), "--all-ranges", "-o", str(out)])
    assert done.exit_code == 0, done.output
    doc = read(out)
    with open_run([trace], phase_map=_all_ranges()) as result:
        check_run(result, doc)
        assert len(slices(doc, True)) == result.phases.height == 16_782
        assert len(slices(doc, False)) == 4368
        first = result.phases.sort("start_ns").row(0, named=True)
    event = next(e for e in slices(doc, True) if e["args"]["path"] == first["path"])
    assert round(event["ts"] * 1000) == first["start_ns"]


def test_ray_capture_gpus_shared_by_two_processes(tmp_path):
    from analysis.synth.ray import RayConfig, generate_ray

    generate_ray(tmp_path / "ray", RayConfig())
    done = timeline_to([tmp_path / "ray"], tmp_path / "ray.json")
    doc = read(done.path)
    with open_run([tmp_path / "ray"]) as result:
        check_run(result, doc)
        assert result.power_samples is not None and done.n_power_samples > 0
    tracks = track_list(doc)
    assert [name for name, _ in tracks[:5]] == [
        "driver pid 1000",
        *("rollout_gpu0 pid 3000", "rollout_gpu1 pid 3001"),
        *("trainer_gpu0 pid 2000", "trainer_gpu1 pid 2001"),
    ]
    gpu0, streams = tracks[5]
    assert gpu0.startswith("GPU GPU-") and gpu0.endswith(" (NVIDIA H100 80GB HBM3)")
    assert streams == [
        *("stream 7 · pid 3000", "stream 15 · pid 3000"),
        *("stream 7 · pid 2000", "stream 13 · pid 2000", "stream 15 · pid 2000"),
    ]


def _all_ranges():
    from analysis.attribute.phase_map import default_phase_map

    return default_phase_map().with_all_ranges()


def test_nest_lanes_moves_partial_overlaps_aside():
    # [0,10] holds [2,5]; [4,12] overlaps both partly; [11,13] fits after [0,10]
    assert nest_lanes([0, 2, 4, 11], [10, 5, 12, 13]) == [0, 0, 1, 0]
    assert nest_lanes([0, 0, 10], [10, 10, 10]) == [0, 0, 0]


def test_partially_overlapping_rows_get_an_extra_track(sample, tmp_path):
    result, _, _ = sample
    row = result.phases.filter(pl.col("path") == "step/reward", pl.col("step") == 1)
    shifted = row.with_columns(  # starts inside reward, ends after it
        pl.lit("straddle").alias("phase"),
        pl.lit("step/straddle").alias("path"),
        pl.col("start_ns") + 1,
        pl.col("end_ns") + 1,
    )
    phases = pl.concat([result.phases, shifted])
    timeline = build_timeline(replace(result, phases=phases), max_ops=200_000)
    doc = read(write_timeline(timeline, tmp_path / "t.json"))
    assert_nested(doc)
    _, threads = names(doc)
    straddle = next(e for e in slices(doc, True) if e["name"] == "straddle")
    assert threads[straddle["pid"], straddle["tid"]] == "driver phases #2"
    assert len(slices(doc, True)) == phases.height


def replace(result: Analysis, **changes: Any) -> Analysis:
    import dataclasses

    return dataclasses.replace(result, **changes)


def test_out_must_be_a_file(tmp_path):
    done = runner.invoke(app, ["timeline", str(SAMPLE), "--out", str(tmp_path)])
    assert done.exit_code == 2 and "is a folder" in done.output


def test_steps_keep_only_those_steps(sample, tmp_path):
    result, _, _ = sample
    out = tmp_path / "steps.json"
    done = runner.invoke(app, ["timeline", str(SAMPLE), "-o", str(out), "--steps", "2:3"])
    assert done.exit_code == 0, done.output
    doc = read(out)
    assert_nested(doc)
    phase_slices = slices(doc, True)
    # the sample's 54 phase rows are 18 per step
    assert len(phase_slices) == 36
    assert {e["args"]["step"] for e in phase_slices} == {2, 3}
    kept = result.gpu_activity.filter(pl.col("window_step").is_in([2, 3])).collect()
    assert len(slices(doc, False)) == kept.height


def test_an_unwritable_out_is_named_not_its_temporary_file():
    done = runner.invoke(app, ["timeline", str(SAMPLE), "--out", "/proc/nvtx-phases-x.json"])
    assert done.exit_code == 2
    assert "--out /proc/nvtx-phases-x.json: cannot write it" in done.output
    assert ".tmp" not in done.output
