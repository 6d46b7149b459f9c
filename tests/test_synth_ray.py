"""The Ray-style synthetic capture and CUDA graph launches: generator-only checks.

Everything here is read back from the written files with plain ``sqlite3`` and recomputed a
second, independent way (a per-nanosecond occupancy mask per physical GPU and per-operation
Python loops) against the generator's ground truth (numpy clipping and a sort-merge union).
None of it uses :mod:`analysis`' readers or attribution.
"""

import json
import re
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from nvtx_phases.analysis.synth.build import SynthConfig, generate
from nvtx_phases.analysis.synth.ray import RayConfig, generate_ray
from nvtxp_testkit import REPO

from nvtx_phases.power import COLUMNS, gpu_uuid

SCHEMA = REPO / "analysis" / "synth" / "schema"
OP_TABLES = {
    "kernel": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
    "graph": "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
}


def reference_ddl() -> dict[str, str]:
    """Table name → body of its CREATE statement, from the vendored schema files."""
    reference = {}
    for name in ("nsys-schema-2022.4.2.sql", "nsys-graph-trace-2024.sql"):
        text = (SCHEMA / name).read_text()
        reference.update(re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", text, flags=re.S))
    return reference


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def tables(con: sqlite3.Connection) -> dict[str, str]:
    return dict(con.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))


@dataclass
class Op:
    kind: str
    file: str
    pid: int
    device: str  # GPU-<uuid> of the physical GPU
    start: int  # run clock
    end: int
    nbytes: int
    nccl: bool


@dataclass
class Capture:
    """What the files of one Ray capture say, on the run clock (the earliest session's)."""

    ops: list[Op]
    driver: list[tuple[int, str, int, int]]  # (step, path, start, end)
    offsets: dict[str, int]
    uuids: dict[str, str | None]


def read_capture(folder: Path) -> Capture:
    files = sorted(folder.glob("*.sqlite"))
    starts, uuids = {}, {}
    for path in files:
        with connect(path) as con:
            (starts[path.name],) = con.execute(
                "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME"
            ).fetchone()
            gpu = (
                con.execute("SELECT id, uuid FROM TARGET_INFO_GPU").fetchall()
                if "TARGET_INFO_GPU" in tables(con)
                else []
            )
            assert len(gpu) <= 1 and all(row[0] == 0 for row in gpu)
            uuids[path.name] = gpu[0][1] if gpu else None
    origin = min(starts.values())
    offsets = {name: t - origin for name, t in starts.items()}
    ops, driver = [], []
    for path in files:
        shift = offsets[path.name]
        with connect(path) as con:
            present = tables(con)
            for kind, table in OP_TABLES.items():
                if table not in present:
                    continue
                name = (
                    "(SELECT value FROM StringIds WHERE id = t.shortName)"
                    if kind == "kernel"
                    else "''"
                )
                nbytes = "t.bytes" if kind in ("memcpy", "memset") else "0"
                rows = con.execute(
                    f"SELECT t.start, t.end, t.deviceId, t.globalPid, {nbytes}, {name} "
                    f"FROM {table} t"
                ).fetchall()
                for start, end, device_id, gpid, b, short in rows:
                    assert device_id == 0  # every process calls its one GPU device 0
                    ops.append(
                        Op(
                            kind,
                            path.name,
                            (gpid >> 24) & 0xFFFFFF,
                            f"GPU-{uuids[path.name]}",
                            start + shift,
                            end + shift,
                            b,
                            short.startswith("nccl"),
                        )
                    )
            ranges = con.execute(
                "SELECT e.start, e.end, s.value, e.int64Value FROM NVTX_EVENTS e "
                "JOIN StringIds s ON s.id = e.textId WHERE e.eventType = 59 AND e.domainId = 1"
            ).fetchall()
            steps = [(s + shift, e + shift, p) for s, e, name, p in ranges if name == "step"]
            for s, e, name, payload in ranges:
                if name == "step":
                    driver.append((payload, "step", s + shift, e + shift))
                else:
                    (step,) = [p for ss, se, p in steps if ss <= s + shift < se]
                    driver.append((step, f"step/{name}", s + shift, e + shift))
    return Capture(ops, sorted(driver), offsets, uuids)


def per_ns_busy(ops: list[Op], device: str, lo: int, hi: int) -> np.ndarray:
    """Occupancy of ``device`` per nanosecond of [lo, hi): any operation of any process."""
    mask = np.zeros(hi - lo, dtype=bool)
    for op in ops:
        if op.device == device:
            mask[max(op.start, lo) - lo : max(min(op.end, hi), lo) - lo] = True
    return mask


def overlap(op: Op, s: int, e: int) -> int:
    return max(0, min(op.end, e) - max(op.start, s))


@pytest.fixture(scope="module")
def ray(tmp_path_factory) -> tuple[Path, dict, Capture]:
    folder = tmp_path_factory.mktemp("ray")
    generate_ray(folder, RayConfig())
    truth = json.loads((folder / "ground_truth.json").read_text())
    return folder, truth, read_capture(folder)


def test_files_have_exactly_the_declared_schema(ray, tmp_path):
    folder, _, _ = ray
    generate(tmp_path / "g.sqlite", SynthConfig(steps=1, graphs=True, lengths=False))
    reference = reference_ddl()
    paths = [*folder.glob("*.sqlite"), tmp_path / "g.sqlite"]
    assert len(paths) == 6
    for path in paths:
        with connect(path) as con:
            written = tables(con)
        for name, sql in written.items():
            assert sql == f"CREATE TABLE {name} ({reference[name]}\n)", (path.name, name)
        has_graphs = path.name.startswith("rollout") or path.name == "g.sqlite"
        assert ("CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in written) == has_graphs
        assert ("TARGET_INFO_GPU" in written) == path.name.startswith(("trainer", "rollout"))


def test_processes_clocks_gpus_and_host(ray):
    folder, truth, cap = ray
    files = {f["file"]: f for f in truth["capture"]["files"]}
    assert sorted(files) == sorted(p.name for p in folder.glob("*.sqlite"))
    assert cap.offsets == {name: f["clock_offset_ns"] for name, f in files.items()}
    assert cap.offsets["driver.sqlite"] == 0 and len(set(cap.offsets.values())) == 5
    devices = [d["device"] for d in truth["devices"]]
    assert len(set(devices)) == truth["n_devices"] == 2
    for g, device in enumerate(devices):
        uuid = device.removeprefix("GPU-")
        # nsys stores the UUID without NVML's "GPU-" prefix; trainer and rollout share the GPU
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        assert cap.uuids[f"trainer_gpu{g}.sqlite"] == cap.uuids[f"rollout_gpu{g}.sqlite"] == uuid
        assert files[f"rollout_gpu{g}.sqlite"]["device"] == device
    hosts, gpus = set(), []
    for path in folder.glob("*.sqlite"):
        with connect(path) as con:
            query = "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'"
            hosts |= {v for (v,) in con.execute(query)}
            (duration,) = con.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()
            for table in [*OP_TABLES.values(), "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"]:
                if table in tables(con):
                    lo, hi = con.execute(f"SELECT min(start), max(end) FROM {table}").fetchone()
                    assert lo is None or (lo >= 0 and hi <= duration), (path.name, table)
            if "TARGET_INFO_GPU" in tables(con):
                con.row_factory = sqlite3.Row
                (row,) = con.execute("SELECT * FROM TARGET_INFO_GPU").fetchall()
                con.row_factory = None
                assert None not in tuple(row)  # every column filled
                gpus.append((row["uuid"], row["busLocation"], row["name"], row["cuDevice"]))
    assert hosts == {truth["capture"]["host"]}
    assert len(set(gpus)) == 2 and {g[2] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {(d["uuid"], d["bus_location"]) for d in truth["devices"]} == {g[:2] for g in gpus}


def test_graph_rows_link_to_their_cudaGraphLaunch_calls(ray, tmp_path):
    folder, _, _ = ray
    generate(tmp_path / "g.sqlite", SynthConfig(steps=2, graphs=True, lengths=False))
    for path in [*folder.glob("rollout_*.sqlite"), tmp_path / "g.sqlite"]:
        with connect(path) as con:
            n_graphs, n_runtime_ids, n_ids = con.execute(
                "SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE), "
                "count(DISTINCT (globalTid >> 24) || ':' || correlationId), count(*) "
                "FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            ).fetchone()
            assert n_graphs > 20 and n_runtime_ids == n_ids  # correlationIds unique per process
            rows = con.execute(
                "SELECT s.value, r.start, g.start, r.globalTid >> 24, g.globalPid >> 24, "
                "(SELECT value FROM StringIds WHERE id = t.nameId) "
                "FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE g "
                "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId "
                "AND r.globalTid >> 24 = g.globalPid >> 24 "
                "JOIN StringIds s ON s.id = r.nameId "
                "LEFT JOIN ThreadNames t ON t.globalTid = r.globalTid"
            ).fetchall()
            assert len(rows) == n_graphs
            for launch, call, start, call_pid, pid, thread in rows:
                assert launch == "cudaGraphLaunch_v10000"
                assert call < start and call_pid == pid  # same process
                if path.name.startswith("rollout"):
                    assert thread == "EngineCore"  # the rollout's launching thread
            # graph executions are not kernels: no kernel row shares their correlationIds
            (shared,) = con.execute(
                "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                "JOIN CUPTI_ACTIVITY_KIND_GRAPH_TRACE g ON g.correlationId = k.correlationId "
                "AND g.globalPid = k.globalPid"
            ).fetchone()
            assert shared == 0


def test_a_graph_execution_straddles_the_end_of_gen(ray):
    _, truth, cap = ray
    graphs = [op for op in cap.ops if op.kind == "graph"]
    for step, path, _, end in cap.driver:
        if path == "step/gen":
            (reward,) = [d for d in cap.driver if d[:2] == (step, "step/reward")]
            crossing = [op for op in graphs if op.start < end and op.end > reward[2]]
            assert len(crossing) == 1  # from gen, over the gap, into reward
            row = next(r for r in truth["driver_phases"] if (r["step"], r["path"]) == reward[:2])
            assert row["graph_ns"] == row["gpu_busy_ns"] == overlap(crossing[0], *reward[2:])


def test_ground_truth_equals_a_per_nanosecond_recount_of_the_files(ray):
    _, truth, cap = ray
    devices = [d["device"] for d in truth["devices"]]
    assert {op.device for op in cap.ops} == set(devices)
    lo = min(op.start for op in cap.ops)
    hi = max(op.end for op in cap.ops)
    masks = {d: per_ns_busy(cap.ops, d, lo, hi) for d in devices}
    by_key = {(r["step"], r["path"]): r for r in truth["driver_phases"]}
    per_device = {(r["step"], r["path"], r["device"]): r for r in truth["phase_devices"]}
    assert sorted(by_key) == [(s, p) for s, p, _, _ in cap.driver]
    for step, path, s, e in cap.driver:
        row = by_key[(step, path)]
        assert (row["start_ns"], row["end_ns"], row["wall_ns"]) == (s, e, e - s)
        busy = {
            d: int(m[max(s, lo) - lo : max(min(e, hi), lo) - lo].sum()) for d, m in masks.items()
        }
        assert row["gpu_busy_ns"] == sum(busy.values())
        assert row["n_devices"] == 2 and row["idle_ns"] == 2 * (e - s) - row["gpu_busy_ns"]
        for kind in OP_TABLES:
            assert row[f"{kind}_ns"] == sum(overlap(op, s, e) for op in cap.ops if op.kind == kind)
        assert row["nccl_ns"] == sum(overlap(op, s, e) for op in cap.ops if op.nccl)
        assert row["n_kernels"] == sum(op.kind == "kernel" and s <= op.start < e for op in cap.ops)
        assert row["n_graphs"] == sum(op.kind == "graph" and s <= op.start < e for op in cap.ops)
        assert row["memcpy_bytes"] == sum(
            op.nbytes for op in cap.ops if op.kind == "memcpy" and s <= op.start < e
        )
        for d in devices:
            dev = per_device[(step, path, d)]
            assert dev["gpu_busy_ns"] == busy[d] and dev["idle_ns"] == e - s - busy[d]
            assert dev["kernel_ns"] == sum(
                overlap(op, s, e) for op in cap.ops if op.kind == "kernel" and op.device == d
            )
    # totals and window conservation (innermost driver phase wins)
    total = sum(op.end - op.start for op in cap.ops)
    in_steps = sum(overlap(op, s, e) for op in cap.ops for _, p, s, e in cap.driver if p == "step")
    in_phases = sum(overlap(op, s, e) for op in cap.ops for _, p, s, e in cap.driver if p != "step")
    assert truth["total_gpu_ns"] == total
    assert truth["window_attributed_gpu_ns"] == in_steps
    assert truth["window_in_phase_gpu_ns"] == in_phases < in_steps < total
    assert truth["window_unattributed_gpu_ns"] == total - in_steps
    for kind in OP_TABLES:
        assert truth[f"{kind}_ns"] == sum(op.end - op.start for op in cap.ops if op.kind == kind)
    assert truth["kernel_ns"] + truth["memcpy_ns"] + truth["memset_ns"] + truth["graph_ns"] == total
    assert truth["n_gpu_ops"] == len(cap.ops)
    assert truth["n_graphs"] == sum(op.kind == "graph" for op in cap.ops) > 0
    for d in truth["devices"]:
        assert d["gpu_busy_ns"] == int(masks[d["device"]].sum())
    kernel_total = sum(k["total_ns"] for k in truth["kernels"].values())
    graph_total = sum(g["total_ns"] for g in truth["graphs"].values())
    assert (kernel_total, graph_total) == (truth["kernel_ns"], truth["graph_ns"])


def test_trainer_and_rollout_overlap_on_one_gpu(ray):
    _, truth, cap = ray
    device = truth["devices"][0]["device"]
    lo, hi = min(op.start for op in cap.ops), max(op.end for op in cap.ops)
    union = per_ns_busy(cap.ops, device, lo, hi)
    by_process = [
        per_ns_busy([op for op in cap.ops if op.file == f"{role}_gpu0.sqlite"], device, lo, hi)
        for role in ("trainer", "rollout")
    ]
    both = by_process[0] & by_process[1]
    assert (by_process[0] | by_process[1]).sum() == union.sum()
    for _, path, s, e in cap.driver:  # both processes run at once in these phases
        if path in ("step/old_log_prob", "step/update_weights"):
            assert both[s - lo : e - lo].sum() > 50_000


def test_worker_phases_are_projection_of_the_trainer_ranges(ray):
    _, truth, cap = ray
    rows = truth["worker_phases"]
    assert {r["phase"] for r in rows} == {"compute_log_prob", "update_actor", "update_weights"}
    assert len(rows) == 2 * 2 * 3 and all(r["pid"] in (2000, 2001) for r in rows)
    projected = sum(r["kernel_ns"] + r["memcpy_ns"] + r["memset_ns"] for r in rows)
    trainer_total = sum(op.end - op.start for op in cap.ops if op.file.startswith("trainer"))
    warmup = 2 * 3 * 90_000  # three warm-up kernels per trainer, launched outside every range
    assert projected == truth["projection_attributed_gpu_ns"] == trainer_total - warmup


def test_generation_is_deterministic(tmp_path):
    cfg = RayConfig(steps=1, gpus=3, decode_steps=16, kernels_per_phase=8)
    a, b = tmp_path / "a", tmp_path / "b"
    generate_ray(a, cfg)
    generate_ray(b, cfg)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert len([n for n in names if n.endswith(".sqlite")]) == 1 + 2 * 3
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    truth = json.loads((a / "ground_truth.json").read_text())
    assert truth["n_devices"] == 3 and truth["driver_phases"][0]["n_devices"] == 3
    generate_ray(tmp_path / "c", RayConfig(**{**cfg.__dict__, "seed": cfg.seed + 1}))
    assert (tmp_path / "c" / "ground_truth.json").read_bytes() != (
        a / "ground_truth.json"
    ).read_bytes()


def test_without_graphs_and_with_rollout_ranges(tmp_path):
    generate_ray(tmp_path, RayConfig(steps=1, graphs=False, rollout_ranges=True, power=False))
    truth = json.loads((tmp_path / "ground_truth.json").read_text())
    assert truth["graph_ns"] == truth["n_graphs"] == 0 and "energy" not in truth
    assert not (tmp_path / "power_nvml.parquet").exists()
    with connect(tmp_path / "rollout_gpu0.sqlite") as con:
        assert "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" not in tables(con)
    phases = {r["phase"] for r in truth["worker_phases"]}
    assert "generate_sequences" in phases
    assert truth["projection_unattributed_gpu_ns"] > 0  # warm-up, KV release, weight loads


def test_power_samples_carry_the_gpu_uuid(ray):
    folder, truth, _ = ray
    frame = pl.read_parquet(folder / "power_nvml.parquet")
    assert tuple(frame.columns) == COLUMNS
    by_index = dict(frame.select("device", "uuid").unique().iter_rows())
    assert by_index == {d["gpu_index"]: d["device"] for d in truth["devices"]}
    last = frame.group_by("uuid").agg(pl.col("energy_mj").max())
    total_j = last["energy_mj"].sum() / 1000
    assert total_j == pytest.approx(truth["energy"]["total_energy_j"], abs=0.01)
    phases = truth["energy"]["driver_phases"]
    assert set(phases[0]["per_device_j"]) == set(by_index.values())


def test_sampler_uuid_spelling():
    class FakeNvml:  # pynvml's two spellings: str (current) and bytes (older releases)
        def __init__(self, value):
            self.value = value

        def nvmlDeviceGetUUID(self, handle):
            if self.value is None:
                raise RuntimeError("not supported")
            return self.value

    uuid = "GPU-cf6b97c0-bf53-a39e-febd-9532190b5766"
    assert gpu_uuid(FakeNvml(uuid), 0) == uuid
    assert gpu_uuid(FakeNvml(uuid.encode()), 0) == uuid
    assert gpu_uuid(FakeNvml(None), 0) is None
    assert "uuid" in COLUMNS and COLUMNS.index("uuid") == COLUMNS.index("device") + 1


def test_graphs_option_of_the_single_file_generator(tmp_path):
    plain = tmp_path / "plain.sqlite"
    generate(plain, SynthConfig(steps=2, lengths=False, power=False))
    plain_truth = json.loads(plain.with_name("plain.ground_truth.json").read_text())
    assert "graphs" not in plain_truth["config"] and "graph_ns" not in plain_truth
    path = tmp_path / "g.sqlite"
    generate(path, SynthConfig(steps=2, lengths=False, power=False, graphs=True))
    truth = json.loads(path.with_name("g.ground_truth.json").read_text())
    assert truth["config"]["graphs"] is True and truth["notes"]
    sums = {}
    with connect(path) as con:
        for kind, table in OP_TABLES.items():
            sums[kind] = con.execute(f"SELECT count(*), sum(end - start) FROM {table}").fetchone()
        gen_end = [
            e
            for (e,) in con.execute(
                "SELECT e.end FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                "WHERE s.value = 'gen'"
            )
        ]
        straddling = con.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE g WHERE "
            + " OR ".join(f"(g.start < {t} AND g.end > {t})" for t in gen_end)
        ).fetchone()[0]
    assert straddling == 2  # rank 0's last decode step, once per step
    assert truth["n_graphs"] == sums["graph"][0] and truth["graph_ns"] == sums["graph"][1]
    assert truth["total_gpu_ns"] == sum(total for _, total in sums.values())
    assert truth["n_kernels"] == sums["kernel"][0]  # graph executions are not kernels
    assert sum(k["total_ns"] for k in truth["kernels"].values()) == sums["kernel"][1]
    # same timeline as without graphs: only the decode kernels' kind changed
    assert truth["total_gpu_ns"] == plain_truth["total_gpu_ns"]
    for with_graphs, without in zip(
        truth["driver_phases"], plain_truth["driver_phases"], strict=True
    ):
        assert with_graphs["gpu_busy_ns"] == without["gpu_busy_ns"]
        assert with_graphs["kernel_ns"] + with_graphs["graph_ns"] == without["kernel_ns"]


def test_nsys_stats_gpukernsum_runs_on_a_rollout_export(ray, tmp_path, nsys):
    folder, _, _ = ray
    copy = tmp_path / "rollout_gpu0.sqlite"  # nsys stats may add tables: never the original
    shutil.copy(folder / "rollout_gpu0.sqlite", copy)
    prefix = tmp_path / "stats"
    subprocess.run(
        [nsys, "stats", "-q", "-r", "gpukernsum", "-f", "csv", "-o", str(prefix), str(copy)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    report = pl.read_csv(f"{prefix}_gpukernsum.csv")
    with connect(copy) as con:
        count, total = con.execute(
            "SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ).fetchone()
    assert report["Instances"].sum() == count and report["Total Time (ns)"].sum() == total


def test_defaults_write_no_graph_table(tmp_path):
    generate(tmp_path / "d.sqlite", SynthConfig(steps=1, lengths=False, power=False))
    with connect(tmp_path / "d.sqlite") as con:
        assert "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" not in tables(con)
        names = {v for (v,) in con.execute("SELECT value FROM StringIds")}
    assert "cudaGraphLaunch_v10000" not in names
