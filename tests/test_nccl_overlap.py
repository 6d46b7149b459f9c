"""NCCL exposed vs overlapped time, and collectives matched across GPUs (wait vs transfer).

Every number is checked against a computation written here: plain SQL over the export's
kernel table and a sorted sweep in Python for unions and overlaps; on a capture built here with
known skew, against values worked out by hand.
"""

import csv
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest
from nvtx_phases.analysis import analyze, write_outputs
from nvtx_phases.analysis.synth.constants import BASE_UTC_NS, DRIVER_PID
from nvtx_phases.analysis.synth.export import ExportFile, Process, write_export
from nvtx_phases.analysis.synth.schema import TABLES
from nvtx_phases.analysis.synth.timeline import GpuOp, Range
from nvtxp_testkit import shared_trace

REAL = "nsysai_mfu_2gpu_before.sqlite"
SAMPLE = Path(__file__).resolve().parents[1] / "traces_sample" / "grpo_synthetic.sqlite"
NCCL_LIKE = "(s.value LIKE 'ncclKernel%' OR s.value LIKE 'ncclDevKernel%')"
OUTPUTS = ("nccl_overlap.csv", "nccl_collectives.csv", "nccl_collectives_by_phase.csv")


def rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def union(intervals):
    """Disjoint blocks of the union of ``[start, end)`` intervals: a sorted sweep."""
    out = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(blocks):
    return sum(e - s for s, e in blocks)


def intersection(a, b):
    """Length of the intersection of two lists of disjoint blocks (every pair, brute force)."""
    return sum(max(0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def kernels(db, where="1"):
    """(device, start, end, name, pid, is_nccl) of every kernel, by plain SQL."""
    with sqlite3.connect(db) as con:
        return con.execute(
            f"SELECT k.deviceId, k.start, k.end, s.value, (k.globalPid >> 24) & 16777215, "
            f"{NCCL_LIKE} FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
            f"ON s.id = k.shortName WHERE {where} ORDER BY k.start"
        ).fetchall()


# --- the real 2×H100 export with NCCL ----------------------------------------------------


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    db = shared_trace(REAL)
    out = tmp_path_factory.mktemp("nccl_real")
    with analyze(db, all_ranges=True, strip_args=True) as run:
        write_outputs(run, out)
    return db, out


def _projected_nccl(db):
    """NCCL kernels launched inside an ``AllToAll4D`` range of the launching thread (SQL)."""
    with sqlite3.connect(db) as con:
        return con.execute(
            f"""
            SELECT DISTINCT k.deviceId, k.start, k.end, s.value
            FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
              ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
            JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.eventType = 59
              AND n.start <= r.start AND r.start < n.end
              AND COALESCE(n.text, (SELECT value FROM StringIds WHERE id = n.textId))
                  LIKE 'AllToAll4D%'
            WHERE {NCCL_LIKE} ORDER BY k.deviceId, k.start
            """
        ).fetchall()


def test_real_overlap_equals_sql_and_a_sweep(real):
    db, out = real
    launched = _projected_nccl(db)
    assert len(launched) == 64  # 33 SendRecv per GPU, the first of each without its launching call
    compute = {}
    for device, s, e, _, _, nccl in kernels(db):
        if not nccl:
            compute.setdefault(device, []).append((s, e))
    table = rows(out / "nccl_overlap.csv")
    top = [r for r in table if r["path"] == "AllToAll4D"]
    assert len(top) == 2
    for r in top:
        device = int(r["device"].rsplit(":", 1)[1])
        blocks = union([(s, e) for d, s, e, _ in launched if d == device])
        overlapped = intersection(blocks, union(compute[device]))
        assert int(r["nccl_ns"]) == length(blocks)
        assert int(r["overlapped_ns"]) == overlapped
        assert int(r["exposed_ns"]) == length(blocks) - overlapped
    # one stream per GPU in this capture: nothing hides NCCL, every ns is exposed
    assert {int(r["nccl_ns"]) for r in top} == {17_072_844, 8_106_669}
    assert all(r["overlapped_ns"] == "0" for r in table)
    # every enclosing phase of the launch holds the same kernels
    assert {(r["device"], r["nccl_ns"]) for r in table} == {
        (r["device"], r["nccl_ns"]) for r in top
    }


def test_real_collectives_equal_sql_pairing(real):
    db, out = real
    launched = _projected_nccl(db)
    per_device = {d: sorted((s, e) for dd, s, e, _ in launched if dd == d) for d in (0, 1)}
    assert len(per_device[0]) == len(per_device[1]) == 32
    table = rows(out / "nccl_collectives.csv")
    assert len(table) == 64
    got = {(int(r["seq"]), int(r["device"][-1])): r for r in table}
    wait = transfer = 0
    stragglers = {0: 0, 1: 0}
    for k in range(32):
        last = max(per_device[0][k][0], per_device[1][k][0])
        stragglers[0 if per_device[0][k][0] == last else 1] += 1
        for d in (0, 1):
            s, e = per_device[d][k]
            r = got[(k, d)]
            assert (int(r["start_ns"]), int(r["end_ns"])) == (s, e)
            assert int(r["last_arrival_ns"]) == last
            assert int(r["wait_ns"]) == last - s
            assert int(r["transfer_ns"]) == e - last
            assert r["straggler"].endswith(":0" if per_device[0][k][0] == last else ":1")
            wait += last - s
            transfer += e - last
    (summary,) = rows(out / "nccl_collectives_by_phase.csv")
    assert int(summary["n_collectives"]) == 32
    assert int(summary["wait_ns"]) == wait == 13_349_041
    assert int(summary["transfer_ns"]) == transfer == 11_830_472
    top = max(stragglers, key=lambda d: (stragglers[d], -d))
    assert summary["top_straggler"].endswith(f":{top}")
    assert int(summary["top_straggler_count"]) == stragglers[top] == 22


def test_no_nccl_no_file(tmp_path):
    db = shared_trace("nsysai_h100_2gpu_1s.sqlite")
    assert not kernels(db, NCCL_LIKE)
    with analyze(db, all_ranges=True, strip_args=True) as run:
        write_outputs(run, tmp_path)
    assert not any((tmp_path / name).exists() for name in OUTPUTS)


# --- the synthetic sample: NCCL on its own stream beside compute ------------------------------


def test_sample_window_overlap_equals_a_sweep(tmp_path):
    with analyze(SAMPLE) as run:
        write_outputs(run, tmp_path)
        ranges = run.ranges.filter(run.ranges["attribution"] == "window").to_dicts()
    ops = kernels(SAMPLE)
    table = rows(tmp_path / "nccl_overlap.csv")
    window = [r for r in table if r["attribution"] == "window"]
    assert window and any(int(r["overlapped_ns"]) > 0 for r in window)
    for r in window:
        device = int(r["device"].rsplit(":", 1)[1])
        compute = union([(s, e) for d, s, e, _, _, n in ops if d == device and not n])
        nccl = overlapped = 0
        for rng in ranges:
            if (rng["trace"], rng["pid"], rng["step"], rng["path"]) != (
                r["trace"],
                int(r["pid"]),
                int(r["step"]),
                r["path"],
            ):
                continue
            a, b = rng["start_ns"], rng["end_ns"]
            blocks = union(
                [(max(s, a), min(e, b)) for d, s, e, _, _, n in ops if d == device and n]
            )
            nccl += length(blocks)
            overlapped += intersection(blocks, compute)
        assert (int(r["nccl_ns"]), int(r["overlapped_ns"])) == (nccl, overlapped)
        assert int(r["exposed_ns"]) == nccl - overlapped


# --- a capture with known skew --------------------------------------------------------------

US = 1_000
ALLREDUCE = ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllReduce_Sum_bf16")
GEMM = ("gemm_bf16", "gemm_bf16")
RANK_PIDS = (2000, 2001)


def _skewed(path):
    """Driver ``step`` ⊃ ``update_actor``; two ranks, each one GPU, two all-reduces.

    GPU 0: gemm [200, 400) µs on stream 7, all-reduce [300, 500) and [600, 650) on stream 13.
    GPU 1: all-reduce [350, 500) and [580, 650), gemm [560, 620).
    """
    driver = [
        Range(DRIVER_PID, DRIVER_PID, "step", 0, 1000 * US, 1, "step", 1),
        Range(DRIVER_PID, DRIVER_PID, "update_actor", 100 * US, 900 * US, 1, "", 1),
    ]
    workers = [Range(p, p, "update_actor", 110 * US, 890 * US, None, "", None) for p in RANK_PIDS]
    plan = {
        0: [(GEMM, 7, 200, 400), (ALLREDUCE, 13, 300, 500), (ALLREDUCE, 13, 600, 650)],
        1: [(ALLREDUCE, 13, 350, 500), (ALLREDUCE, 13, 580, 650), (GEMM, 7, 560, 620)],
    }
    ops = []
    for gpu, items in plan.items():
        for i, (name, stream, start, end) in enumerate(items):
            call = (120 + 10 * i) * US
            ops.append(
                GpuOp("kernel", RANK_PIDS[gpu], RANK_PIDS[gpu], gpu, stream, start * US,
                      end * US, call, call + 4 * US, i + 1, name=name)
            )  # fmt: skip
    pids = (DRIVER_PID, *RANK_PIDS)
    spec = ExportFile(
        processes=tuple(Process(p, f"p{p}", ((p, f"p{p}"),)) for p in pids),
        tables=TABLES,
        shift_ns=0,
        session_utc_ns=BASE_UTC_NS,
        session_iso="",
        duration_ns=1000 * US,
        host="synthetic",
        generated_by="test_nccl_overlap",
        env=(("Hostname", 619, "synthetic"),),
        launch_kinds=("kernel",),
        grid_x=108,
        local_device=False,
    )
    timeline = SimpleNamespace(driver=driver, workers=workers, ops=ops)
    write_export(path, spec, timeline, clock_marks=False)  # type: ignore[arg-type]
    return path


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nccl_skew")
    db = _skewed(folder / "skew.sqlite")
    with analyze(db) as run:
        write_outputs(run, folder / "out")
    return folder / "out"


def test_known_overlap(skewed):
    got = {
        (r["attribution"], r["path"], r["device"][-1]): (
            int(r["nccl_ns"]),
            int(r["exposed_ns"]),
            int(r["overlapped_ns"]),
        )
        for r in rows(skewed / "nccl_overlap.csv")
    }
    # GPU 0: NCCL 200 + 50 µs, gemm covers [300, 400): 100 overlapped; GPU 1: NCCL 150 + 70,
    # gemm covers [580, 620): 40 overlapped
    gpu0, gpu1 = (250 * US, 150 * US, 100 * US), (220 * US, 180 * US, 40 * US)
    expected = {}
    for attribution, path in (
        ("window", "step"),
        ("window", "step/update_actor"),
        ("projection", "update_actor"),
    ):
        expected[(attribution, path, "0")] = gpu0
        expected[(attribution, path, "1")] = gpu1
    assert got == expected


def test_known_wait_and_transfer(skewed):
    got = {
        (r["attribution"], r["seq"], r["device"][-1]): (
            int(r["wait_ns"]),
            int(r["transfer_ns"]),
            r["straggler"][-1],
        )
        for r in rows(skewed / "nccl_collectives.csv")
    }
    # first all-reduce: GPU 1 arrives last (350), GPU 0 waits 50; both transfer 150
    # second: GPU 0 arrives last (600), GPU 1 waits 20; both transfer 50
    per_scheme = {
        ("0", "0"): (50 * US, 150 * US, "1"),
        ("0", "1"): (0, 150 * US, "1"),
        ("1", "0"): (0, 50 * US, "0"),
        ("1", "1"): (20 * US, 50 * US, "0"),
    }
    expected = {(a, *k): v for a in ("window", "projection") for k, v in per_scheme.items()}
    assert got == expected
    summary = {r["attribution"]: r for r in rows(skewed / "nccl_collectives_by_phase.csv")}
    assert set(summary) == {"window", "projection"}
    assert summary["window"]["path"] == "step/update_actor"
    for r in summary.values():
        assert int(r["n_collectives"]) == 2
        assert int(r["wait_ns"]) == 70 * US
        assert int(r["transfer_ns"]) == 400 * US
        assert r["top_straggler"][-1] == "0"  # a tie (one each): the first device name
        assert int(r["top_straggler_count"]) == 1


def test_from_an_analysis_folder(skewed, tmp_path):
    from nvtx_phases.analysis import load_analysis

    with load_analysis(skewed) as saved:
        write_outputs(saved, tmp_path)
    for name in OUTPUTS:
        assert (tmp_path / name).read_bytes() == (skewed / name).read_bytes()
