"""Device memory per phase (``memory_per_phase.csv``) and VeRL's logged memory per step.

Expected values are computed here from the raw inputs (the Kineto JSON's events, SQL over the
hand-built rows, the log's text), never through :mod:`analysis.aggregate.memory`.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis import analyze
from nvtx_phases.analysis.workload import verl_logs as wl
from nvtx_phases.analysis.workload import verl_memory

ROOT = Path(__file__).resolve().parents[1]
KINETO = ROOT.parent / "shared" / "traces" / "kineto"
SAMPLE = ROOT / "traces_sample" / "grpo_synthetic.sqlite"
DDL = ROOT.parent / "shared" / "nsys" / "schema-2022.4.2.sql"


def _ns(ts: object) -> int:
    return int((Decimal(str(ts)) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


def _brute(events: list[tuple[int, int]], initial: int, start: int, end: int):
    """(n, entry, peak, mean) over [start, end) of a level that is ``level`` after each event."""
    entry = initial
    for ts, level in events:
        if ts < start:
            entry = level
    inside = [(ts, lv) for ts, lv in events if start <= ts < end]
    peak = max([entry, *(lv for _, lv in inside)])
    area, at, current = Fraction(0), start, entry
    for ts, lv in inside:
        area += current * (ts - at)
        at, current = ts, lv
    area += current * (end - at)
    return len(inside), entry, peak, (area / (end - start) if end > start else None)


@pytest.mark.parametrize(
    "name",
    ["brainstorm__brt_dr_3390402.1663735857573.pt.trace.json", "hta__df_index_resolver.json.gz"],
)
def test_real_kineto_memory_per_phase(name: str) -> None:
    path = KINETO / name
    if not path.exists():
        pytest.skip("real Kineto traces not available")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    events = doc["traceEvents"]
    mem = [
        e
        for e in events
        if e.get("ph") == "i"
        and e.get("name") == "[memory]"
        and e["args"].get("Device Type") in (1, 6)
    ]
    assert mem
    result = analyze(path, all_ranges=True)
    table = result.memory
    assert table is not None
    # the trace's clock → the run's: the phase rows start where their user_annotation starts
    ranges = {
        (e["name"], _ns(e["ts"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation"
    }
    row0 = table.row(0, named=True)
    origin = next(ts for n, ts in sorted(ranges, key=lambda r: r[1]) if n == row0["phase"])
    origin -= row0["start_ns"]
    for device_id in sorted({e["args"]["Device Id"] for e in mem}):
        mine = [e for e in mem if e["args"]["Device Id"] == device_id]
        # stable order by time: the file's order within an instant
        mine.sort(key=lambda e: _ns(e["ts"]))
        levels = [(_ns(e["ts"]) - origin, int(e["args"]["Total Allocated"])) for e in mine]
        initial = int(mine[0]["args"]["Total Allocated"]) - int(mine[0]["args"]["Bytes"])
        rows = table.filter(pl.col("device").str.ends_with(f":{device_id}"))
        assert rows.height == result.phases.height
        assert set(rows["basis"]) == {"allocator_total"}
        chosen = (
            rows.sort("n_events", descending=True)
            .head(15)
            .vstack(rows.sample(min(15, rows.height), seed=1))
        )
        for row in chosen.iter_rows(named=True):
            n, entry, peak, mean = _brute(levels, initial, row["start_ns"], row["end_ns"])
            assert (row["n_events"], row["entry_bytes"], row["peak_bytes"]) == (n, entry, peak)
            if mean is None:
                assert row["mean_bytes"] is None
            else:
                assert row["mean_bytes"] == pytest.approx(float(mean), rel=1e-9)
    # the busiest phase holds a real peak above its entry level
    assert (table["peak_bytes"] > table["entry_bytes"]).any()


def _with_memory_rows(tmp_path: Path, rows: list[tuple[int, int, int, int, int]]) -> Path:
    """The sample export with CUDA_GPU_MEMORY_USAGE_EVENTS (the real DDL) holding ``rows``."""
    target = tmp_path / "run.sqlite"
    shutil.copy(SAMPLE, target)
    ddl = DDL.read_text(encoding="utf-8")
    create = re.search(r"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS \(.*?\);", ddl, re.S)
    assert create is not None
    with sqlite3.connect(target) as db:
        db.execute(create.group(0))
        db.executemany(
            "INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, "
            "address, pc, bytes, memKind, memoryOperationType) VALUES (?, 0, ?, 1, 0, 0, ?, ?, ?)",
            rows,
        )
    return target


def test_hand_built_nsys_rows(tmp_path: Path) -> None:
    if not SAMPLE.exists() or not DDL.exists():
        pytest.skip("sample export or nsys schema not available")
    plain = analyze(SAMPLE)
    window = plain.phases.filter(pl.col("attribution") == "window").sort("start_ns")
    gen = window.filter(pl.col("phase") == "gen").row(0, named=True)
    s, e = gen["start_ns"], gen["end_ns"]
    d = (e - s) // 4
    # device 0: +100 before the phase; in it +50 at s, +30 at s+d, −60 at s+2d; a pinned
    # (host) allocation of 1000 that must not count; a free after the phase
    rows = [
        (s - 10, 0, 100, 2, 0),
        (s, 0, 50, 2, 0),
        (s + d, 0, 30, 2, 0),
        (s + d, 0, 999, 1, 0),
        (s + 2 * d, 0, 60, 2, 1),
        (e + 5, 0, 120, 2, 1),
    ]
    path = _with_memory_rows(tmp_path, rows)
    table = analyze(path).memory
    assert table is not None
    row = table.filter(
        (pl.col("attribution") == "window")
        & (pl.col("start_ns") == s)
        & (pl.col("path") == gen["path"])
        & (pl.col("device").str.ends_with(":0") | pl.col("device").str.starts_with("GPU-"))
    )
    assert row.height >= 1
    got = row.row(0, named=True)
    # by hand: entry 100; levels 150 (at s), 180 (s+d), 120 (s+2d); peak 180
    assert got["basis"] == "since_capture_start"
    assert (got["n_events"], got["entry_bytes"], got["peak_bytes"]) == (3, 100, 180)
    wall = e - s
    expected = (150 * d + 180 * d + 120 * (wall - 2 * d)) / wall
    assert got["mean_bytes"] == pytest.approx(expected, rel=1e-12)
    # the same from SQL over the raw rows (device memory only)
    with sqlite3.connect(path) as db:
        (entry,) = db.execute(
            "SELECT SUM(CASE memoryOperationType WHEN 0 THEN bytes ELSE -bytes END) "
            "FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 AND start < ?",
            (s,),
        ).fetchone()
    assert got["entry_bytes"] == entry
    # offload/onload: D2H / H2D bytes of the GPU's copies starting in each row, by SQL
    with sqlite3.connect(path) as db:
        for row in table.iter_rows(named=True):
            for column, kind in (("h2d_bytes", 1), ("d2h_bytes", 2)):
                (want,) = db.execute(
                    "SELECT COALESCE(SUM(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                    "WHERE copyKind = ? AND deviceId = 0 AND start >= ? AND start < ?",
                    (kind, row["start_ns"], row["end_ns"]),
                ).fetchone()
                assert row[column] == want, (row["path"], column)
    assert table["h2d_bytes"].sum() > 0 and table["d2h_bytes"].sum() > 0


def test_no_memory_events_says_so(tmp_path: Path) -> None:
    if not SAMPLE.exists():
        pytest.skip("sample export not available")
    result = analyze(SAMPLE)
    assert result.memory is None
    assert any("CUDA_GPU_MEMORY_USAGE_EVENTS" in note for note in result.notes)
    from nvtx_phases.analysis.render.outputs.files import write_outputs

    write_outputs(result, tmp_path / "out")
    assert not (tmp_path / "out" / "memory_per_phase.csv").exists()
    # the note is saved in summary.json (``notes``, beside the warnings) and read back
    saved = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    assert saved["notes"] == list(result.notes)
    memory_notes = [n for n in saved["notes"] if n.startswith("no CUDA_GPU_MEMORY_USAGE_EVENTS ")]
    assert memory_notes == [
        "no CUDA_GPU_MEMORY_USAGE_EVENTS in the run's files (capture with `nsys profile "
        "--cuda-memory-usage=true` or torch.profiler(profile_memory=True)): no memory per phase "
        "table"
    ]
    from nvtx_phases.analysis.model import RunSummary
    from nvtx_phases.analysis.render.outputs.files import load_analysis

    assert load_analysis(tmp_path / "out").summary.notes == saved["notes"]
    # a summary.json written before notes were saved reads back with none
    del saved["notes"]
    assert RunSummary.from_dict(saved).notes == []


def _logged(path: Path) -> dict[tuple[int, str, str], float]:
    """(step, prefix, metric) → value, straight from the log's text (last one wins)."""
    found: dict[tuple[int, str, str], float] = {}
    pattern = re.compile(
        r"((?:[\w-]+/)*)perf/(max_memory_allocated_gb|max_memory_reserved_gb|cpu_memory_used_gb)"
        r"""["']?\s*:\s*(?:np\.float64\()?([-+0-9.eE]+)"""
    )
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        step = re.search(r"step:(\d+) - |\"step\":\s*(\d+)", line)
        if not step:
            continue
        n = int(step.group(1) or step.group(2))
        for prefix, metric, value in pattern.findall(line):
            found[(n, prefix, metric)] = float(value)
    return found


@pytest.mark.parametrize(
    "log",
    [
        "verl_cpu_run/verl_console.log",
        "verl_logs/console_grpo.log",
        "verl_logs/file_logger_ppo.jsonl",
    ],
)
def test_logged_memory_per_step(log: str) -> None:
    path = ROOT / "tests" / "data" / log
    table, notes = verl_memory.memory_per_step(wl.latest_values(wl.read_logs([path])))
    expected = _logged(path)
    assert expected and table.height
    for row in table.iter_rows(named=True):
        for metric in verl_memory.MEMORY_KEYS:
            want = expected.get((row["step"], row["prefix"], metric))
            device = metric != "cpu_memory_used_gb"
            if want is None or (device and want == 0.0):
                assert row[metric] is None  # not logged, or 0 from a run without a GPU
            else:
                assert row[metric] == pytest.approx(want)
    assert {(r["step"], r["prefix"]) for r in table.iter_rows(named=True)} == {
        (k[0], k[1]) for k in expected
    }
    if log.startswith("verl_cpu_run"):
        # the real CPU run: no GPU, so device memory is null; its CPU memory as logged
        assert table["max_memory_allocated_gb"].null_count() == table.height
        assert table["cpu_memory_used_gb"].round(3).to_list() == [7.528, 7.521]
        assert notes


def test_profile_passes_cuda_memory_usage(tmp_path: Path) -> None:
    import subprocess

    from nvtx_phases.nsys import Nsys, ProfileOptions, profile_args

    nsys = shutil.which("nsys")
    if nsys is None:
        pytest.skip("nsys not installed")
    help_text = subprocess.run([nsys, "profile", "--help"], capture_output=True, text=True).stdout
    assert "--cuda-memory-usage=" in help_text  # Debian's nsys 2022.4 has it
    real = Nsys(path=nsys, version="2022.4", profile_help=help_text)
    args, _ = profile_args(real, ProfileOptions(), tmp_path / "r", gpu=False)
    assert "--cuda-memory-usage=true" in args
    off = profile_args(real, ProfileOptions(cuda_memory_usage=False), tmp_path / "r", gpu=False)
    assert "--cuda-memory-usage=true" not in off[0]
    without = help_text.replace("--cuda-memory-usage=", "")
    old = Nsys(path=nsys, version="2020.1", profile_help=without)
    args, notes = profile_args(old, ProfileOptions(), tmp_path / "r", gpu=False)
    assert "--cuda-memory-usage=true" not in args
    assert any("--cuda-memory-usage" in n for n in notes)
