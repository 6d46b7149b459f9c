"""One nsys 2022.4-schema export per process of the Ray capture (plus the 2024.x graph table)."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

from analysis.synth.build import (
    _GRAPH_COLUMNS,
    _KERNEL_COLUMNS,
    _MEMCPY_COLUMNS,
    _MEMSET_COLUMNS,
    BASE_UTC_NS,
    DRIVER_PID,
    GRAPH_TRACE_TABLE,
    LAUNCH_NAMES,
    TABLES,
    US,
    VM_ID,
    _ddl,
    _enum_rows,
    _gtid,
    _insert,
    graph_trace_ddl,
    write_export_meta,
)
from analysis.synth.ray.model import (
    BUS_LOCATIONS,
    RayBuilder,
    RayProcess,
)
from nvtx_phases.power import clock_mark_text

GPU_NAME = "NVIDIA H100 80GB HBM3"
#: TARGET_INFO_GPU columns after (vmId, id, name, busLocation) and before uuid, then after uuid,
#: as CUDA and nsys report an H100 SXM5 80GB.
_GPU_PROPS_BEFORE_UUID = {
    "isDiscrete": 1,
    "l2CacheSize": 52_428_800,
    "totalMemory": 85_029_158_912,
    "memoryBandwidth": 3_352_320_000_000,
    "clockRate": 1_980_000_000,
    "smCount": 132,
}
_GPU_PROPS_AFTER_UUID = {
    "luid": 0,
    "chipName": "GH100",
    "cuDevice": 0,  # the process sees one GPU (CUDA_VISIBLE_DEVICES), its CUDA device 0
    "ctxswDevPath": "",
    "ctrlDevPath": "",
    "revision": 161,
    "nodeMask": 0,
    "constantMemory": 65_536,
    "maxIPC": 4,
    "maxRegistersPerBlock": 65_536,
    "maxShmemPerBlock": 49_152,
    "maxShmemPerBlockOptin": 232_448,
    "maxShmemPerSm": 233_472,
    "maxRegistersPerSm": 65_536,
    "threadsPerWarp": 32,
    "asyncEngines": 3,
    "maxWarpsPerSm": 64,
    "maxBlocksPerSm": 32,
    "maxThreadsPerBlock": 1024,
    "maxBlockDimX": 1024,
    "maxBlockDimY": 1024,
    "maxBlockDimZ": 64,
    "maxGridDimX": 2_147_483_647,
    "maxGridDimY": 65_535,
    "maxGridDimZ": 65_535,
    "computeMajor": 9,
    "computeMinor": 0,
    "smMajor": 9,
    "smMinor": 0,
}
#: TARGET_INFO_SYSTEM_ENV rows (name, nameEnum, value) besides Hostname, as nsys writes them.
_SYSTEM_ENV = (
    ("CpuCores", 1, "224"),
    ("CpuArchitecture", 3, "x86_64"),
    ("NvDriverVersion", 205, "550.54.15"),
    ("OsDescription", 605, "Ubuntu 22.04.4 LTS"),
    ("CudaDriverVersion", 611, "12040"),
)
RAY_TABLES = TABLES | {"TARGET_INFO_GPU"}


# --- writing ---------------------------------------------------------------------------------


def _iso(utc_ns: int) -> str:
    return datetime.fromtimestamp(utc_ns // 1_000_000_000, tz=timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S"
    )


def write_process(path: Path, b: RayBuilder, proc: RayProcess) -> None:
    """Write one process's export: its own session clock, its GPU as deviceId 0."""
    cfg = b.cfg
    shift = proc.shift_ns
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.executescript(_ddl(RAY_TABLES if proc.gpu is not None else TABLES))
        con.executescript(_enum_rows())
        strings: dict[str, int] = {}

        def sid(text: str) -> int:
            return strings.setdefault(text, len(strings))

        sid("[Unknown]")
        write_export_meta(
            con, cfg.host, f"nvtx-phases analysis.synth.ray (Ray capture, {proc.role})"
        )
        env = [("Hostname", 619, cfg.host), *_SYSTEM_ENV]
        con.executemany(
            "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?, ?, ?)",
            [(VM_ID, "Local (CLI)", name, enum, value) for name, enum, value in env],
        )
        utc = BASE_UTC_NS + shift
        con.execute(
            "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)",
            (utc, _iso(utc), _iso(utc)),
        )
        duration = b.duration - shift
        con.execute(
            "INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (VM_ID, duration, 0, duration)
        )
        con.execute(
            "INSERT INTO PROCESSES VALUES (?, ?, ?)",
            (VM_ID | (proc.pid << 24), proc.pid, proc.name),
        )
        con.executemany(
            "INSERT INTO ThreadNames VALUES (?, ?, ?)",
            [(sid(name), 10, _gtid(proc.pid, tid)) for tid, name in proc.threads],
        )
        if proc.gpu is not None:
            g = proc.gpu
            row = {
                "vmId": VM_ID,
                "id": 0,  # the only GPU this process sees
                "name": GPU_NAME,
                "busLocation": BUS_LOCATIONS[g],
                **_GPU_PROPS_BEFORE_UUID,
                "pwGpuId": g,
                "uuid": b.uuids[g],
                **_GPU_PROPS_AFTER_UUID,
            }
            con.execute(_insert("TARGET_INFO_GPU", tuple(row)), tuple(row.values()))

        nvtx = []
        if proc.role == "driver":
            gt = _gtid(DRIVER_PID, DRIVER_PID)
            nvtx.append((0, None, 75, None, "verl", gt, None, 1, None))  # domain create
            if cfg.power:  # the sampler ran in the driver: its clock marks are here
                nvtx.append((0, None, 75, None, "nvtx_phases", gt, None, 2, None))
                for t, mono, wall in b.clock_marks():
                    nvtx.append(
                        (t, None, 34, None, None, gt, sid(clock_mark_text(mono, wall)), 2, None)
                    )
            for r in b.driver:  # registered strings, domain "verl", step number as payload
                nvtx.append((r.start, r.end, 59, 0xFF00FF00, None, gt, sid(r.name), 1, r.payload))
        for r in b.workers:
            if r.pid == proc.pid:
                nvtx.append(
                    (
                        r.start - shift,
                        r.end - shift,
                        59,
                        None,
                        r.name,
                        _gtid(r.pid, r.tid),
                        None,
                        0,
                        None,
                    )
                )
        con.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, color, text, globalTid, textId, "
            "domainId, int64Value) VALUES (?,?,?,?,?,?,?,?,?)",
            nvtx,
        )
        mine = [o for o in b.ops if o.pid == proc.pid]
        launch = {kind: sid(LAUNCH_NAMES[kind]) for kind in sorted({o.kind for o in mine})}
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)",
            [
                (
                    o.call_start - shift,
                    o.call_start - shift + (12 if o.kind == "graph" else 4) * US,
                    0,
                    _gtid(o.pid, o.tid),
                    o.correlation,
                    launch[o.kind],
                    0,
                    None,
                )
                for o in mine
            ],
        )
        rows: dict[str, list[tuple]] = {"kernel": [], "memcpy": [], "memset": [], "graph": []}
        for o in mine:
            common = (
                o.start - shift,
                o.end - shift,
                0,
                1,
                o.stream,
                o.correlation,
                VM_ID | (o.pid << 24),
            )
            if o.kind == "kernel":
                short, demangled = o.name
                grid = (132, 1, 1, 256, 1, 1, 0, 0, 0, 0)
                rows["kernel"].append(
                    (*common, sid(demangled), sid(short), 64, *grid, len(rows["kernel"]) + 1)
                )
            elif o.kind == "memcpy":
                rows["memcpy"].append((*common, o.nbytes, o.copy_kind, 0, 0))
            elif o.kind == "memset":
                rows["memset"].append((*common, 0, o.nbytes, 2))
            else:
                rows["graph"].append((*common, *o.graph))
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_KERNEL", _KERNEL_COLUMNS), rows["kernel"])
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_MEMCPY", _MEMCPY_COLUMNS), rows["memcpy"])
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_MEMSET", _MEMSET_COLUMNS), rows["memset"])
        if rows["graph"]:  # exports are lazy: the table exists only where a graph ran
            con.executescript(graph_trace_ddl())
            con.executemany(_insert(GRAPH_TRACE_TABLE, _GRAPH_COLUMNS), rows["graph"])
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in strings.items()])
        con.commit()
    finally:
        con.close()
