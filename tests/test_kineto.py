"""PyTorch profiler (Kineto) traces analyze like nsys exports.

Every real trace in ../shared/traces/kineto (other people's, 2021-2026 layouts) is loaded through
the reader and compared with sums written here over the raw JSON (stdlib json, decimals exact)
and with the folder's own truth.tsv; the two-rank NCCL set is analyzed as one run; a CPU capture
made here with ``torch.profiler`` gives the phases and steps it marked.
"""

from __future__ import annotations

import csv
import decimal
import gzip
import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.errors import AnalysisError
from nvtx_phases.analysis.read.export import read_export
from nvtx_phases.analysis.run.inputs import folder_inputs, resolve_trace_inputs
from nvtx_phases.analysis.run.load import load_trace
from nvtx_phases.analysis.run.pipeline import analyze
from nvtxp_testkit import REPO, shared_path

KINETO = "traces/kineto"
NAMES = sorted(
    p.name for p in (REPO.parent / "shared" / KINETO).glob("*.json*") if p.is_file()
) or ["(absent)"]
KERNEL, MEMCPY, MEMSET = {"kernel"}, {"gpu_memcpy", "memcpy"}, {"gpu_memset", "memset"}
RUNTIME = {"cuda_runtime", "cuda_driver", "runtime"}


def raw_events(path: Path) -> tuple[dict, list[dict]]:
    """The trace's top level and events, every decimal number exact (Decimal)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        doc = json.loads(fh.read().decode("utf-8", "replace"), parse_float=decimal.Decimal)
    return doc, [e for e in doc["traceEvents"] if isinstance(e, dict)]


def ns(us) -> int:
    """µs (int or Decimal) → ns, nearest, ties to even."""
    return int((decimal.Decimal(us) * 1000).quantize(1, rounding=decimal.ROUND_HALF_EVEN))


def brute(path: Path) -> dict:
    """Counts and totals over the raw events, written without the reader."""
    _, events = raw_events(path)
    out: dict = defaultdict(int)
    by_device: Counter[str] = Counter()
    for e in events:
        if e.get("ph") != "X":
            continue
        cat = str(e.get("cat", "")).lower()
        dur = ns(e.get("dur", 0))
        args = e.get("args") or {}
        if cat in KERNEL:
            out["n_kernels"] += 1
            out["kernel_ns"] += dur
            by_device[str(args.get("device", e.get("pid")))] += dur
        elif cat in MEMCPY:
            out["n_memcpy"] += 1
            out["memcpy_ns"] += dur
            out["memcpy_bytes"] += int(args.get("bytes") or 0)
        elif cat in MEMSET:
            out["n_memset"] += 1
            out["memset_ns"] += dur
        elif cat in ("user_annotation", "record_function"):
            out["n_ranges"] += 1
            out["range_ns"] += dur
        elif cat in RUNTIME and args.get("correlation"):
            out["n_calls"] += 1
    out["by_device"] = dict(by_device)
    return out


def truth_rows() -> dict[str, dict[str, str]]:
    with (shared_path(KINETO) / "truth.tsv").open() as fh:
        return {row["file"]: row for row in csv.DictReader(fh, delimiter="\t")}


def us3(total_ns: int) -> str:
    """ns → µs with 3 decimals, as truth.tsv writes them (exact: ns are whole)."""
    return f"{decimal.Decimal(total_ns) / 1000:.3f}"


@pytest.mark.parametrize("name", NAMES)
def test_real_trace_totals(name):
    path = shared_path(f"{KINETO}/{name}")
    loaded = load_trace(path, "t")
    ops = loaded.ops.frame
    assert ops is not None
    want = brute(path)
    by_kind = {
        k: ops.filter(pl.col("kind") == k)
        .select(
            pl.len().alias("n"),
            (pl.col("end_ns") - pl.col("start_ns")).sum().alias("ns"),
            pl.col("bytes").sum().alias("bytes"),
        )
        .row(0, named=True)
        for k in ("kernel", "memcpy", "memset")
    }
    got = {
        "n_kernels": by_kind["kernel"]["n"],
        "kernel_ns": by_kind["kernel"]["ns"] or 0,
        "n_memcpy": by_kind["memcpy"]["n"],
        "memcpy_ns": by_kind["memcpy"]["ns"] or 0,
        "memcpy_bytes": by_kind["memcpy"]["bytes"] or 0,
        "n_memset": by_kind["memset"]["n"],
        "memset_ns": by_kind["memset"]["ns"] or 0,
        "n_ranges": loaded.ranges.height,
        "range_ns": int((loaded.ranges["end_ns"] - loaded.ranges["start_ns"]).sum() or 0),
        "n_calls": loaded.n_calls + loaded.n_duplicated_calls,
    }
    for key, value in got.items():
        assert value == want[key], (key, value, want[key])
    kernels = ops.filter(pl.col("kind") == "kernel")
    per_device = kernels.group_by("device").agg((pl.col("end_ns") - pl.col("start_ns")).sum())
    assert {d.rsplit(":", 1)[1]: v for d, v in per_device.iter_rows()} == want["by_device"]
    # the folder's own truth (float sums rounded to 3 decimals, no ph filter)
    truth = truth_rows()[name]
    assert int(truth["n_kernels"]) == got["n_kernels"]
    assert truth["kernel_dur_us"] == us3(got["kernel_ns"])
    assert int(truth["n_memcpy"]) == got["n_memcpy"]
    assert truth["memcpy_dur_us"] == us3(got["memcpy_ns"])
    assert int(truth["n_memset"]) == got["n_memset"]
    assert truth["memset_dur_us"] == us3(got["memset_ns"])
    assert int(truth["n_user_annotations"]) == got["n_ranges"]
    # a launching call for every operation whose correlation id a call carries
    linked = ops.filter(pl.col("call_start_ns").is_not_null()).height
    assert linked <= ops.height


def test_clock_and_notes():
    """baseTimeNanoseconds + ts is the UTC clock; what a trace lacks is said once."""
    path = shared_path(f"{KINETO}/hta__nccl_data.json.gz")
    doc, events = raw_events(path)
    window = next(e for e in events if e.get("cat") == "Trace")
    raw = read_export(path)
    assert raw.label == "hta__nccl_data"
    assert raw.session_start_utc_ns == int(doc["baseTimeNanoseconds"]) + ns(window["ts"])
    assert raw.duration_ns == ns(window["dur"])
    assert raw.meta["KINETO_RANK"] == "0" and raw.meta["KINETO_WORLD_SIZE"] == "2"
    notes = [w for w in raw.warnings if "Kineto" in w]
    assert len(notes) == 1 and "gpu_user_annotation" in notes[0] and "baseTime" in notes[0]
    no_window = read_export(shared_path(f"{KINETO}/tracelens__b200_eager_trace.json.gz"))
    assert no_window.duration_ns is None
    assert any("capture duration unknown" in w for w in no_window.warnings)


def test_two_ranks_one_run(tmp_path):
    """The NCCL rank pair, given as a folder, is one run on one clock."""
    names = ["hta_vit2r__sampled_rank-0.json.gz", "hta_vit2r__sampled_rank-1.json.gz"]
    for name in names:
        (tmp_path / name).symlink_to(shared_path(f"{KINETO}/{name}"))
    (tmp_path / "config.json").write_text('{"not": "a trace"}')
    assert [p.name for p in folder_inputs(tmp_path)] == names
    assert resolve_trace_inputs([tmp_path]) == [tmp_path / n for n in names]
    with analyze([tmp_path]) as result:
        summary = result.summary.to_dict()
    wants = [brute(tmp_path / n) for n in names]
    assert summary["n_kernels"] == sum(w["n_kernels"] for w in wants)
    assert summary["kernel_ns"] == sum(w["kernel_ns"] for w in wants)
    assert summary["memcpy_ns"] == sum(w["memcpy_ns"] for w in wants)
    assert summary["n_devices"] == 2
    truth = truth_rows()
    nccl_us = sum(decimal.Decimal(truth[n]["nccl_kernel_dur_us"]) for n in names)
    assert summary["nccl_ns"] == int(nccl_us * 1000)
    assert not any("different runs" in w for w in summary["warnings"])
    # aligned through UTC: rank 1's window starts 553 µs after rank 0's (epoch µs, no base)
    starts = [raw_events(tmp_path / n)[1] for n in names]
    first = [ns(next(e for e in ev if e.get("cat") == "Trace")["ts"]) for ev in starts]
    loaded = [load_trace(tmp_path / n, n) for n in names]
    assert loaded[1].clock_zero_utc_ns - loaded[0].clock_zero_utc_ns == first[1] - first[0]


def _capture(out: Path) -> Path:
    """A CPU torch.profiler capture: 3 steps of gen then update_actor (record_function)."""
    script = f"""
import torch
from torch.profiler import profile, record_function, ProfilerActivity
x = torch.randn(64, 64)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3):
        with record_function("step"):
            with record_function("gen"):
                for _ in range(20):
                    x = torch.tanh(x @ x)
            with record_function("update_actor"):
                for _ in range(10):
                    x = torch.relu(x + 1)
prof.export_chrome_trace({str(out)!r})
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    return out


def test_torch_profiler_capture_phases(tmp_path):
    pytest.importorskip("torch")
    trace = _capture(tmp_path / "cpu.pt.trace.json")
    _, events = raw_events(trace)
    marked = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"] in ("step", "gen", "update_actor")
    )
    assert len(marked) == 9
    with analyze([trace]) as result:
        phases = result.phases
        steps = result.steps
    assert steps.height == 3
    rows = phases.filter(pl.col("phase").is_in(["gen", "update_actor"])).sort("start_ns")
    assert rows["phase"].to_list() == ["gen", "update_actor"] * 3
    assert rows["step"].to_list() == [s for s in sorted(set(rows["step"])) for _ in range(2)]
    # each phase lies inside its step, with the duration the profiler wrote
    origin = min(s for s, _, _ in marked)
    spans = [(s - origin, e - origin, n) for s, e, n in marked if n != "step"]
    got = [
        (s - rows["start_ns"].min(), e - rows["start_ns"].min(), n)
        for s, e, n in rows.select("start_ns", "end_ns", "phase").iter_rows()
    ]
    first = spans[0][0]
    assert got == [(s - first, e - first, n) for s, e, n in spans]
    step_rows = steps.sort("step_start_ns")
    for row in rows.iter_rows(named=True):
        step = step_rows.filter(pl.col("step") == row["step"]).row(0, named=True)
        assert step["step_start_ns"] <= row["start_ns"] <= row["end_ns"] <= step["step_end_ns"]


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("config.json", b'{"a": 1}', "JSON without a traceEvents list"),
        ("cut.json.gz", gzip.compress(b'{"traceEvents": [' + b"{}," * 5000)[:-12], "gzip"),
        ("bad.json", b'{"traceEvents": [', "invalid JSON"),
    ],
)
def test_bad_input_one_line(tmp_path, name, content, reason):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(AnalysisError) as caught:
        read_export(path)
    message = str(caught.value)
    assert "\n" not in message and reason in message and str(path) in message


def test_bad_input_cli(tmp_path):
    path = tmp_path / "cut.pt.trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": [' + b"{}," * 5000)[:-12])
    done = subprocess.run(
        [sys.executable, "-m", "nvtx_phases.analysis.cli", "analyze", str(path), "--out",
         str(tmp_path / "out"), "-q"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1 and "truncated or corrupt gzip" in done.stderr
