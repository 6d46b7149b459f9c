"""The asynchronous (disaggregated) synthetic capture, ``synth --async`` (issue 28 item 7).

(a) the files' structure, read back with plain ``sqlite3``; (b) the generator's ground truth
against a second, independent computation over the raw rows (pure-Python interval arithmetic:
clock alignment by session start, pools from the pool marks, union per GPU, the innermost range
per elementary segment), following the issue-28 conventions literally; (c) ``analyze``'s
per-pool outputs against the truth to the ns (pool attribution lands on main: xfail here).
None of (a)/(b) uses :mod:`analysis`' readers or attribution.
"""

from __future__ import annotations

import bisect
import csv
import hashlib
import itertools
import json
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl
import pytest
from nvtx_phases.analysis.synth.async_rl import AsyncConfig, generate_async

from nvtx_phases.naming import pool_mark_text

SMALL = AsyncConfig(steps=3, kernels_per_phase=8, decode_kernels=10)
IDLE_CAUSES = {
    "starvation",
    "refit",
    "partial_rollout_pause",
    "generation_limit",
    "validation",
    "other",
    "no_phase",
}


# --- a reader of the raw rows, written for this test ---------------------------------------------


@dataclass
class Rng:
    trace: str
    pid: int
    name: str
    start: int
    end: int
    payload: int | None
    domain: str


@dataclass
class Op:
    kind: str
    trace: str
    pid: int
    device: str
    start: int
    end: int
    name: str
    corr: int


@dataclass
class Capture:
    folder: Path
    offsets: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    devices: dict[str, str | None] = field(default_factory=dict)
    marks: list[tuple[str, int, str, str, int | None]] = field(default_factory=list)
    ranges: list[Rng] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    calls: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)


def read_capture(folder: Path) -> Capture:
    """Every export of ``folder``, on the earliest session's clock."""
    cap = Capture(folder)
    files = sorted(folder.glob("*.sqlite"))
    starts = {}
    for f in files:
        with sqlite3.connect(f"file:{f}?mode=ro", uri=True) as con:
            starts[f.stem] = con.execute(
                "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"
            ).fetchone()[0]
    base = min(starts.values())
    for f in files:
        trace = f.stem
        off = cap.offsets[trace] = starts[trace] - base
        con = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        ((pid, name),) = con.execute("SELECT pid, name FROM PROCESSES").fetchall()
        cap.pids[trace], cap.names[trace] = pid, name
        cap.devices[trace] = None
        if "TARGET_INFO_GPU" in tables:
            ((uuid,),) = con.execute("SELECT uuid FROM TARGET_INFO_GPU").fetchall()
            cap.devices[trace] = f"GPU-{uuid}"
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        domains = {0: ""} | dict(
            con.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = 75")
        )
        for start, end, etype, color, text, tid, domain, payload in con.execute(
            "SELECT start, end, eventType, color, text, textId, domainId, int64Value "
            "FROM NVTX_EVENTS WHERE eventType IN (34, 59)"
        ):
            label = text if text is not None else strings[tid]
            if etype == 34:
                cap.marks.append((trace, start + off, label, domains[domain], color))
            else:
                cap.ranges.append(
                    Rng(trace, pid, label, start + off, end + off, payload, domains[domain])
                )
        counts = {}
        for kind, table in (
            ("kernel", "CUPTI_ACTIVITY_KIND_KERNEL"),
            ("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY"),
            ("memset", "CUPTI_ACTIVITY_KIND_MEMSET"),
            ("runtime", "CUPTI_ACTIVITY_KIND_RUNTIME"),
        ):
            counts[kind] = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            if kind == "runtime":
                for s, e, corr in con.execute(f"SELECT start, end, correlationId FROM {table}"):
                    cap.calls[(trace, corr)] = (s + off, e + off)
                continue
            name_sql = "shortName" if kind == "kernel" else "0"
            for s, e, corr, short in con.execute(
                f"SELECT start, end, correlationId, {name_sql} FROM {table}"
            ):
                label = strings[short] if kind == "kernel" else ""
                device = cap.devices[trace]
                assert device is not None, f"{trace}: GPU operations without a GPU"
                cap.ops.append(Op(kind, trace, pid, device, s + off, e + off, label, corr))
        cap.counts[trace] = counts
        con.close()
    return cap


def pools(cap: Capture) -> dict[str, dict]:
    """Pools from the pool marks: role → its traces and its GPUs (marked and used)."""
    out: dict[str, dict] = {}
    for trace, _, text, _, _ in cap.marks:
        if not text.startswith("nvtx_phases.pool "):
            continue
        fields = dict(item.split("=", 1) for item in text.split()[1:])
        pool = out.setdefault(fields["role"], {"traces": set(), "devices": set()})
        pool["traces"].add(trace)
        pool["devices"].update(g for g in fields.get("gpus", "").split(",") if g)
    for pool in out.values():
        pool["devices"].update(o.device for o in cap.ops if o.trace in pool["traces"])
    return out


def merged(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def covered(union: list[tuple[int, int]], s: int, e: int) -> int:
    return sum(max(0, min(e, b) - max(s, a)) for a, b in union)


def window_ranges(cap: Capture, pool: dict) -> list[Rng]:
    return [r for r in cap.ranges if r.trace in pool["traces"] and r.domain == "nvtx_phases"]


def depth(r: Rng, ranges: list[Rng]) -> int:
    return sum(
        1
        for o in ranges
        if o is not r and o.start <= r.start and r.end <= o.end and o.trace == r.trace
    )


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("async")
    generate_async(out, SMALL)
    return out


@pytest.fixture(scope="module")
def untraced(tmp_path_factory):
    out = tmp_path_factory.mktemp("async_untraced")
    generate_async(out, replace(SMALL, untraced_rollout=True))
    return out


def truth_of(folder: Path) -> dict:
    return json.loads((folder / "ground_truth.json").read_text())


# --- (a) structure -------------------------------------------------------------------------------


def test_one_export_per_process_with_its_pool_mark(traced):
    cap = read_capture(traced)
    assert sorted(cap.pids) == [
        "rollout_gpu2",
        "rollout_gpu3",
        "rollouter",
        "trainer_controller",
        "trainer_gpu0",
        "trainer_gpu1",
    ]
    assert cap.names["trainer_controller"] == "ray::FullyAsyncTrainer"
    assert cap.names["rollouter"] == "ray::FullyAsyncRollouter"
    assert len(set(cap.pids.values())) == 6
    devices = [d for d in cap.devices.values() if d is not None]
    assert len(set(devices)) == 4  # one physical GPU per worker and server
    for trace in cap.pids:
        (mark,) = [m for m in cap.marks if m[0] == trace and m[2].startswith("nvtx_phases.pool")]
        _, _, text, domain, color = mark
        role = "trainer" if trace.startswith("trainer") else "rollout"
        gpus = () if cap.devices[trace] is None else (cap.devices[trace],)
        assert text == pool_mark_text(role, gpus)
        assert (domain, color) == ("nvtx_phases", 255)  # nvtx.mark's default blue, as recorded
    with sqlite3.connect(traced / "rollout_gpu2.sqlite") as con:
        row = con.execute(
            "SELECT text, textId IS NOT NULL, int64Value FROM NVTX_EVENTS WHERE eventType = 34"
        ).fetchone()
    assert row == (None, 1, None)  # a registered string, no payload
    found = pools(cap)
    assert {k: sorted(v["traces"]) for k, v in found.items()} == {
        "trainer": ["trainer_controller", "trainer_gpu0", "trainer_gpu1"],
        "rollout": ["rollout_gpu2", "rollout_gpu3", "rollouter"],
    }
    assert not found["trainer"]["devices"] & found["rollout"]["devices"]


def test_controllers_ranges_versions_tile_and_samples_marks(traced):
    cap = read_capture(traced)
    by = {t: [r for r in cap.ranges if r.trace == t] for t in cap.pids}
    assert all(not by[t] for t in ("rollout_gpu2", "rollout_gpu3"))  # a server marks no range
    versions = sorted((r for r in by["rollouter"] if r.name == "version"), key=lambda r: r.start)
    assert [r.payload for r in versions] == list(range(SMALL.steps + 1))
    assert all(a.end == b.start for a, b in itertools.pairwise(versions))
    inner = [r for r in by["rollouter"] if r.name != "version"]
    assert {r.name for r in inner} == {
        "gen",
        "param_sync",
        "partial_pause",
        "staleness_wait",
        "validate",
    }
    for r in inner:  # inside its version, with the version as payload
        (v,) = [v for v in versions if v.start <= r.start and r.end <= v.end]
        assert r.payload == v.payload and r.domain == "nvtx_phases"
    steps = sorted((r for r in by["trainer_controller"] if r.name == "step"), key=lambda r: r.start)
    assert [r.payload for r in steps] == [1, 2, 3]
    for s in steps:
        names = [
            r.name
            for r in sorted(by["trainer_controller"], key=lambda r: r.start)
            if r.name != "step" and s.start <= r.start and r.end <= s.end
        ]
        assert names == ["gen", "reward", "old_log_prob", "adv", "update_actor", "param_sync"]
    samples = [m for m in cap.marks if m[2].startswith("nvtx_phases.samples ")]
    assert {m[0] for m in samples} == {"trainer_controller"}
    assert len(samples) == SMALL.steps
    for _, t, text, domain, _ in samples:
        fields = dict(item.split("=", 1) for item in text.split()[1:])
        (step,) = [s for s in steps if s.start <= t < s.end]
        assert int(fields["step"]) == step.payload and int(fields["version"]) == step.payload - 1
        counts = [int(x.split(":")[1]) for x in fields["versions"].split(",")]
        assert sum(counts) == 32 and domain == "nvtx_phases"


def test_rollout_gen_overlaps_trainer_update_actor(traced):
    cap = read_capture(traced)
    gens = [r for r in cap.ranges if r.trace == "rollouter" and r.name == "gen"]
    updates = [
        r for r in cap.ranges if r.trace == "trainer_controller" and r.name == "update_actor"
    ]
    overlap = [
        min(g.end, u.end) - max(g.start, u.start)
        for g in gens
        for u in updates
        if min(g.end, u.end) > max(g.start, u.start)
    ]
    assert len(overlap) >= SMALL.steps - 1 and max(overlap) > 5_000_000  # > 5 ms
    # both pools compute in the overlap: rollout kernels and trainer kernels at once
    rollout = merged([(o.start, o.end) for o in cap.ops if o.trace.startswith("rollout_gpu")])
    trainer = merged([(o.start, o.end) for o in cap.ops if o.trace.startswith("trainer_gpu")])
    both = sum(covered(rollout, s, e) for s, e in trainer)
    assert both > 1_000_000


def test_nccl_where_the_conventions_put_it(traced):
    cap = read_capture(traced)

    def inside(op: Op, name: str, trace: str) -> bool:
        return any(
            r.trace == trace and r.name == name and r.start <= op.start and op.end <= r.end
            for r in cap.ranges
        )

    nccl = [o for o in cap.ops if o.name.startswith("nccl")]
    allreduce = [o for o in nccl if "AllReduce" in o.name]
    assert allreduce and all(o.trace.startswith("trainer_gpu") for o in allreduce)
    assert all(inside(o, "update_actor", "trainer_controller") for o in allreduce)
    broadcast = [o for o in nccl if "Broadcast" in o.name]
    for side in ("trainer_gpu", "rollout_gpu"):
        mine = [o for o in broadcast if o.trace.startswith(side)]
        assert len(mine) == 4 * SMALL.steps * 2  # 4 buckets per update, 2 GPUs per pool
        assert all(inside(o, "param_sync", "trainer_controller") for o in mine)
        assert all(inside(o, "param_sync", "rollouter") for o in mine)


def test_untraced_rollout_has_no_gpu_operations_but_its_marks_and_power(untraced):
    cap = read_capture(untraced)
    for trace in ("rollout_gpu2", "rollout_gpu3"):
        assert all(n == 0 for n in cap.counts[trace].values()), cap.counts[trace]
        assert cap.devices[trace] is not None  # nsys still lists the GPU
        assert [m for m in cap.marks if m[0] == trace and m[2].startswith("nvtx_phases.pool")]
    assert all(o.trace.startswith("trainer_gpu") for o in cap.ops)
    found = pools(cap)
    assert len(found["rollout"]["devices"]) == 2  # from the marks alone
    power = pl.read_parquet(untraced / "power_nvml.parquet")
    busy = power.filter(pl.col("power_w") > SMALL.idle_power_w)
    assert found["rollout"]["devices"] <= set(busy["uuid"].to_list())
    assert cap.counts["trainer_gpu0"]["kernel"] > 0  # the trainer's side is traced as before


def test_deterministic_for_a_seed(traced, tmp_path):
    generate_async(tmp_path / "again", SMALL)
    generate_async(tmp_path / "other", replace(SMALL, seed=SMALL.seed + 1))

    def digest(folder: Path) -> dict[str, str]:
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
        }

    assert digest(tmp_path / "again") == digest(traced)
    assert digest(tmp_path / "other") != digest(traced)


# --- (b) the truth against a brute-force recount of the raw rows -------------------------------


def brute_rows(cap: Capture, idle_w: float, power: pl.DataFrame, run_of_mono: int) -> list[dict]:
    """Per window range: its pool's operations clipped to it, union per GPU (plain Python)."""
    out = []
    found = pools(cap)
    for name, pool in found.items():
        devices = pool["devices"]
        ops = [o for o in cap.ops if o.device in devices]
        workers = [r for r in cap.ranges if r.trace in pool["traces"] and r.domain != "nvtx_phases"]
        for r in window_ranges(cap, pool):
            part = {k: 0 for k in ("kernel_ns", "nccl_ns", "memcpy_ns", "memset_ns")}
            busy = 0
            for dev in devices:
                clipped = []
                for o in ops:
                    if o.device != dev:
                        continue
                    s, e = max(o.start, r.start), min(o.end, r.end)
                    if e > s:
                        clipped.append((s, e))
                        part[f"{o.kind}_ns"] += e - s
                        if o.kind == "kernel" and o.name.startswith("nccl"):
                            part["nccl_ns"] += e - s
                busy += sum(e - s for s, e in merged(clipped))
            any_op = any(o.start < r.end and o.end > r.start for o in ops)
            hot = power.filter(
                pl.col("uuid").is_in(sorted(devices))
                & (pl.col("mono_ns") - run_of_mono >= r.start)
                & (pl.col("mono_ns") - run_of_mono < r.end)
                & (pl.col("power_w") > idle_w)
            )
            open_worker = any(w.start < r.end and w.end > r.start for w in workers)
            captured = bool(ops) and (any_op or not (hot.height > 0 or open_worker))
            n = len(devices)
            wall = r.end - r.start
            figures = {**part, "gpu_busy_ns": busy, "idle_ns": wall * n - busy}
            out.append(
                {
                    "pool": name,
                    "trace": r.trace,
                    "phase": r.name,
                    "step": r.payload,
                    "start_ns": r.start,
                    "end_ns": r.end,
                    "wall_ns": wall,
                    "n_devices": n,
                    "captured": captured,
                    **{k: (v if captured else None) for k, v in figures.items()},
                }
            )
    return out


def sampler_offset(cap: Capture) -> int:
    """Sampler mono clock minus the run clock, from a clock mark in the trainer controller."""
    for trace, t, text, _, _ in cap.marks:
        if text.startswith("nvtx_phases.power_clock "):
            mono = int(text.split()[1].removeprefix("mono_ns="))
            assert trace == "trainer_controller"
            return mono - t
    raise AssertionError("no clock mark")


CAUSE = {
    "wait_for_enough_samples": "starvation",
    "param_sync": "refit",
    "update_weights": "refit",
    "weight_sync": "refit",
    "partial_pause": "partial_rollout_pause",
    "staleness_wait": "generation_limit",
    "testing": "validation",
    "validate": "validation",
}


def brute_idle_causes(cap: Capture, rows: list[dict]) -> dict[tuple, int | None]:
    """Idle per (pool, step, cause) over each pool's span, segment by elementary segment."""
    out: dict[tuple, int | None] = {}
    captured = {(r["pool"], r["phase"], r["step"], r["start_ns"]): r["captured"] for r in rows}
    for name, pool in pools(cap).items():
        ranges = window_ranges(cap, pool)
        lo, hi = min(r.start for r in ranges), max(r.end for r in ranges)
        per_dev = {
            d: merged([(o.start, o.end) for o in cap.ops if o.device == d]) for d in pool["devices"]
        }
        cuts = {lo, hi} | {x for r in ranges for x in (r.start, r.end)}
        cuts |= {x for u in per_dev.values() for iv in u for x in iv if lo < x < hi}
        edges = sorted(cuts)
        depths = {id(r): depth(r, ranges) for r in ranges}
        for s, e in itertools.pairwise(edges):
            holders = [r for r in ranges if r.start <= s and e <= r.end]
            inner = max(holders, key=lambda r: (depths[id(r)], r.start), default=None)
            busy = 0
            for union in per_dev.values():
                i = bisect.bisect_right(union, (s, float("inf"))) - 1
                if i >= 0 and union[i][0] <= s and e <= union[i][1]:
                    busy += e - s
            idle = (e - s) * len(per_dev) - busy
            if inner is None:
                cause, step, known = "no_phase", None, True
            else:
                cause = (
                    "starvation"
                    if inner.name == "gen" and name == "trainer"
                    else CAUSE.get(inner.name, "other")
                )
                step, known = (
                    inner.payload,
                    captured[(name, inner.name, inner.payload, inner.start)],
                )
            key = (name, step, cause)
            prev = out.get(key, 0)
            out[key] = None if prev is None or not known else prev + idle
    return out


@pytest.mark.parametrize("which", ["traced", "untraced"])
def test_truth_equals_a_recount_of_the_raw_rows(which, request):
    folder = request.getfixturevalue(which)
    cap, truth = read_capture(folder), truth_of(folder)
    power = pl.read_parquet(folder / "power_nvml.parquet")
    rows = brute_rows(cap, SMALL.idle_power_w, power, sampler_offset(cap))
    keys = ("pool", "trace", "phase", "step", "start_ns", "end_ns", "wall_ns", "n_devices")
    keys += ("captured", "gpu_busy_ns", "idle_ns", "kernel_ns", "nccl_ns", "memcpy_ns")
    keys += ("memset_ns",)

    def key(r: dict) -> tuple:
        return (r["pool"], r["phase"], r["step"], r["start_ns"])

    expected = {key(r): {k: r[k] for k in keys} for r in rows}
    got = {key(r): {k: r[k] for k in keys} for r in truth["window_phases"]}
    assert got == expected
    # conservation per pool, from independent sums
    for pool in truth["pools"]:
        p = pools(cap)[pool["pool"]]
        assert set(pool["devices"]) == p["devices"] and pool["n_devices"] == len(p["devices"])
        ops = [o for o in cap.ops if o.device in p["devices"]]
        total = sum(o.end - o.start for o in ops)
        spans = merged([(r.start, r.end) for r in window_ranges(cap, p)])
        inside = sum(covered(spans, o.start, o.end) for o in ops)
        if not ops:  # nothing of the pool captured: its GPU time unknown, never 0
            assert pool["captured"] is False
            assert pool["total_gpu_ns"] is pool["attributed_gpu_ns"] is None
            assert pool["unattributed_gpu_ns"] is None
            continue
        assert pool["captured"] is True
        assert (pool["total_gpu_ns"], pool["attributed_gpu_ns"]) == (total, inside)
        assert pool["attributed_gpu_ns"] + pool["unattributed_gpu_ns"] == pool["total_gpu_ns"]
        assert pool["unattributed_gpu_ns"] > 0  # warm-up and keep-alives
    causes = {(c["pool"], c["step"], c["cause"]): c["idle_ns"] for c in truth["idle_causes"]}
    assert causes == brute_idle_causes(cap, rows)
    assert {c for _, _, c in causes} <= IDLE_CAUSES
    for pool in truth["pools"]:  # causes add up to the idle of the pool over its span
        mine = [v for (p, _, _), v in causes.items() if p == pool["pool"]]
        span = None if None in mine else sum(mine)
        assert pool["span_idle_ns"] == span
    if which == "traced":
        assert all(r["captured"] for r in rows)
        assert {c for _, _, c in causes} == IDLE_CAUSES  # no_phase: between trainer steps
    else:  # no rollout figure captured (not even its idle waits), every trainer one
        assert all(r["captured"] == (r["pool"] == "trainer") for r in rows)
        lost = [r for r in truth["window_phases"] if r["pool"] == "rollout"]
        assert all(r["gpu_busy_ns"] is r["idle_ns"] is r["kernel_ns"] is None for r in lost)
        waits = [r for r in lost if r["phase"] == "staleness_wait"]
        assert waits and not any(r["power_active"] for r in waits)  # idle, yet not known


def test_staleness_truth_from_the_samples_marks(traced):
    cap, truth = read_capture(traced), truth_of(traced)
    expected = []
    for _, _, text, _, _ in sorted(
        (m for m in cap.marks if m[2].startswith("nvtx_phases.samples ")), key=lambda m: m[1]
    ):
        f = dict(item.split("=", 1) for item in text.split()[1:])
        version = int(f["version"])
        pairs = [(int(v), int(n)) for v, n in (x.split(":") for x in f["versions"].split(","))]
        total = sum(n for _, n in pairs)
        lags = [version - v for v, _ in pairs]
        expected.append(
            {
                "step": int(f["step"]),
                "min": min(lags),
                "max": max(lags),
                "mean": sum((version - v) * n for v, n in pairs) / total,
                "share_lag_ge_1": sum(n for v, n in pairs if version - v >= 1) / total,
            }
        )
    got = [
        {k: s[k] for k in ("step", "min", "max", "mean", "share_lag_ge_1")}
        for s in truth["staleness"]
    ]
    assert got == expected
    assert max(s["max"] for s in got) == 2 and got[0]["max"] == 0


def test_worker_phases_are_the_projection_of_the_trainer_ranges(traced):
    cap, truth = read_capture(traced), truth_of(traced)
    for w in truth["worker_phases"]:
        launched = [
            o
            for o in cap.ops
            if o.trace == w["trace"]
            and w["start_ns"] <= cap.calls[(o.trace, o.corr)][0] <= w["end_ns"]
        ]
        assert w["kernel_ns"] == sum(o.end - o.start for o in launched if o.kind == "kernel")
        nccl = sum(o.end - o.start for o in launched if o.name.startswith("nccl"))
        assert w["nccl_ns"] == nccl
    assert {w["phase"] for w in truth["worker_phases"]} == {
        "compute_log_prob",
        "update_actor",
        "weight_sync",
    }


# --- (c) analyze against the truth -----------------------------------------------------------


def cell(value: object) -> str:
    return "" if value is None else str(value)


@pytest.mark.parametrize("which", ["traced", "untraced"])
def test_analyze_matches_the_truth_per_pool(which, request, tmp_path):
    from nvtx_phases.analysis.jobs import analyze_to

    folder = request.getfixturevalue(which)
    truth = truth_of(folder)
    with analyze_to([folder], tmp_path / "run", figures=False):
        pass
    with (tmp_path / "run" / "phases.csv").open() as fh:
        table = [r for r in csv.DictReader(fh) if r["attribution"] == "window"]
    assert table and "pool" in table[0], "phases.csv has no pool column"
    got = {(r["pool"], r["phase"], r["step"], r["trace"]): r for r in table}
    assert len(got) == len(truth["window_phases"])
    for w in truth["window_phases"]:
        row = got[(w["pool"], w["phase"], str(w["step"]), w["trace"])]
        for k in (
            "wall_ns",
            "n_devices",
            "gpu_busy_ns",
            "idle_ns",
            "kernel_ns",
            "nccl_ns",
            "memcpy_ns",
            "memcpy_bytes",
            "memset_ns",
            "n_kernels",
        ):
            assert row[k] == cell(w[k]), (w["pool"], w["phase"], w["step"], k)
        assert row["kernels_captured"] == str(w["captured"]).lower()
    with (tmp_path / "run" / "pools.csv").open() as fh:
        pool_rows = {r["pool"]: r for r in csv.DictReader(fh)}
    for p in truth["pools"]:
        row = pool_rows[p["pool"]]
        assert row["total_gpu_ns"] == cell(p["total_gpu_ns"])
        assert row["attributed_gpu_ns"] == cell(p["attributed_gpu_ns"])
        assert row["unattributed_gpu_ns"] == cell(p["unattributed_gpu_ns"])
        assert row["n_devices"] == str(p["n_devices"])
        assert row["devices"].split(",") == sorted(p["devices"])
        assert row["captured"] == str(p["captured"]).lower()
    with (tmp_path / "run" / "idle_causes.csv").open() as fh:
        found = {(r["pool"], r["step"], r["cause"]): r["idle_ns"] for r in csv.DictReader(fh)}
    assert len(found) == len(truth["idle_causes"])
    for c in truth["idle_causes"]:
        assert found[(c["pool"], cell(c["step"]), c["cause"])] == cell(c["idle_ns"])
    with (tmp_path / "run" / "staleness.csv").open() as fh:
        stale = {int(r["step"]): r for r in csv.DictReader(fh)}
    assert sorted(stale) == [r["step"] for r in truth["staleness"]]
    for r in truth["staleness"]:
        row = stale[r["step"]]
        assert int(row["version"]) == r["version"] and int(row["n_samples"]) == r["n_samples"]
        assert int(row["min_lag"]) == r["min"] and int(row["max_lag"]) == r["max"]
        assert float(row["mean_lag"]) == pytest.approx(r["mean"], abs=1e-12)
        assert float(row["stale_share"]) == pytest.approx(r["share_lag_ge_1"], abs=1e-12)


# --- the command -------------------------------------------------------------------------------


def test_synth_command_writes_the_async_capture_and_rejects_mixed_options(tmp_path):
    from nvtx_phases.analysis.cli import app
    from typer.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "cap"
    args = ["synth", str(out), "--async", "--steps", "1", "--gpus", "1", "--rollout-gpus", "3"]
    result = runner.invoke(app, [*args, "--kernels", "4", "--untraced-rollout", "--no-power"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "ground_truth.json",
        "rollout_gpu1.sqlite",
        "rollout_gpu2.sqlite",
        "rollout_gpu3.sqlite",
        "rollouter.sqlite",
        "trainer_controller.sqlite",
        "trainer_gpu0.sqlite",
    ]
    truth = truth_of(out)
    (rollout,) = [p for p in truth["pools"] if p["pool"] == "rollout"]
    assert rollout["captured"] is False and rollout["n_devices"] == 3  # no power: still null
    assert not any(r["captured"] for r in truth["window_phases"] if r["pool"] == "rollout")
    config = truth["config"]
    assert (config["trainer_gpus"], config["rollout_gpus"], config["untraced_rollout"]) == (
        1,
        3,
        True,
    )
    for bad, says in (
        (["--untraced-rollout"], "--untraced-rollout is an option of --async"),
        (["--async", "--ray"], "--ray and --async"),
        (["--async", "--gpus", "5", "--rollout-gpus", "4"], "at most 8 GPUs"),
    ):
        result = runner.invoke(app, ["synth", str(tmp_path / "bad"), *bad])
        assert result.exit_code != 0 and says in result.output, result.output
