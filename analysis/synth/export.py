"""Write one nsys 2022.4-schema SQLite export of some processes of a synthetic timeline.

Both captures go through :func:`write_export`: the GRPO run (one export, or one per process)
and the Ray capture (one per process). What differs between their files (host, session clock,
processes, the GPU each process sees) is an :class:`ExportFile`; the events come from the
:class:`~analysis.synth.timeline.Timeline`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvtx_phases.power import clock_mark_text

from .constants import DRIVER_PID, LAUNCH_NAMES, VM_ID
from .memory import MemoryEvent
from .schema import (
    GRAPH_COLUMNS,
    GRAPH_TRACE_TABLE,
    KERNEL_COLUMNS,
    MEMCPY_COLUMNS,
    MEMSET_COLUMNS,
    ddl,
    enum_rows,
    graph_trace_ddl,
    insert,
)
from .timeline import GpuOp, Timeline

NVTX_COLUMNS = (
    "start",
    "end",
    "eventType",
    "color",
    "text",
    "globalTid",
    "textId",
    "domainId",
    "int64Value",
)
NVTX_MARK, NVTX_RANGE, NVTX_DOMAIN_CREATE = 34, 59, 75  # ENUM_NSYS_EVENT_TYPE ids
#: the columns of a ``CUDA_GPU_MEMORY_USAGE_EVENTS`` row the synthetic exports fill (nsys 2022.4's
#: DDL; ``name``, ``correlationId`` and the memory-pool columns stay null)
MEMORY_COLUMNS = (
    "start",
    "globalPid",
    "deviceId",
    "contextId",
    "address",
    "pc",
    "bytes",
    "memKind",
    "memoryOperationType",
)
MEMORY_TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
_VERL_DOMAIN, _PHASES_DOMAIN = 1, 2  # domainIds of "verl" and "nvtx_phases" (default: 0)
_DRIVER_COLOR = 0xFF00FF00
#: Writes an export's NVTX_EVENTS rows (``NVTX_COLUMNS``) given the string registry's ``id``.
NvtxRows = Callable[[Callable[[str], int]], list[tuple]]


@dataclass(frozen=True)
class Process:
    """One profiled process: its name and its named threads (tid, name)."""

    pid: int
    name: str
    threads: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class ExportFile:
    """What one export holds besides the timeline's events, and how it sees them."""

    processes: tuple[Process, ...]
    tables: set[str]
    #: The session started this much after the run clock's 0: every timestamp minus this.
    shift_ns: int
    session_utc_ns: int
    #: ``utcTime`` and ``localTime`` of ``TARGET_INFO_SESSION_START_TIME``.
    session_iso: str
    duration_ns: int
    host: str
    generated_by: str
    #: ``TARGET_INFO_SYSTEM_ENV`` rows: (name, nameEnum, value).
    env: tuple[tuple[str, int, str], ...]
    #: Launch kinds whose runtime API names are registered, in this order.
    launch_kinds: tuple[str, ...]
    #: ``gridX`` of every kernel (one block per SM).
    grid_x: int
    #: Every process sees its GPU as ``deviceId`` 0 (else the physical index).
    local_device: bool
    #: The ``TARGET_INFO_GPU`` row (column → value), where the export has that table.
    gpu_row: dict[str, object] | None = None

    @property
    def pids(self) -> set[int]:
        """The processes whose events this export holds."""
        return {p.pid for p in self.processes}


class _Strings(dict[str, int]):
    """``StringIds``: text → id, in first-use order."""

    def id(self, text: str) -> int:
        return self.setdefault(text, len(self))


def gtid(pid: int, tid: int) -> int:
    """The nsys ``globalTid`` of thread ``tid`` of process ``pid``."""
    return VM_ID | (pid << 24) | tid


def global_pid(pid: int) -> int:
    """The nsys ``globalPid`` of process ``pid``."""
    return VM_ID | (pid << 24)


def write_export_meta(con: sqlite3.Connection, host: str, generated_by: str) -> None:
    """The ``EXPORT_META_DATA`` rows of an nsys 2022.4.2 export (schema 3.0.0)."""
    con.executemany(
        "INSERT INTO EXPORT_META_DATA VALUES (?, ?)",
        [
            ("EXPORT_PRODUCT_NAME", "NVIDIA Nsight Systems"),
            ("EXPORT_PRODUCT_VERSION", "2022.4.2.1"),
            ("EXPORT_SCHEMA_VERSION", "3.0.0"),
            ("EXPORT_SCHEMA_VERSION_MAJOR", "3"),
            ("EXPORT_SCHEMA_VERSION_MINOR", "0"),
            ("EXPORT_SCHEMA_VERSION_MICRO", "0"),
            ("EXPORT_HOST", host),
            ("EXPORT_LAZY", "true"),
            ("GENERATED_BY", generated_by),
        ],
    )


def write_export(
    path: Path,
    f: ExportFile,
    tl: Timeline,
    *,
    clock_marks: bool,
    nvtx: NvtxRows | None = None,
    ops: Sequence[GpuOp] | None = None,
    memory: Sequence[MemoryEvent] = (),
) -> None:
    """Write the events of ``f.processes`` to a fresh export at ``path``.

    ``clock_marks``: the power sampler ran in the driver, so its clock marks are among the
    driver's NVTX events (where the driver is in this export). ``nvtx``: the NVTX rows, where
    the capture writes its own (else the driver's and the workers' ranges of ``tl``). ``ops``:
    the GPU operations the export holds (default: every one of its processes'). ``memory``:
    CUDA memory events, of which the export's processes' are written (``f.tables`` must then
    hold ``CUDA_GPU_MEMORY_USAGE_EVENTS``).
    """
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    # a fixture rewritten from scratch: no fsync per statement (the ENUM rows are thousands;
    # 30x faster), and the file's bytes are the same either way
    con.execute("PRAGMA synchronous=OFF")
    try:
        con.executescript(ddl(f.tables))
        con.executescript(enum_rows())
        strings = _Strings()
        strings.id("[Unknown]")
        _write_target(con, f, strings)
        rows = _nvtx_rows(f, tl, strings, clock_marks) if nvtx is None else nvtx(strings.id)
        con.executemany(insert("NVTX_EVENTS", NVTX_COLUMNS), rows)
        mine = [o for o in (tl.ops if ops is None else ops) if o.pid in f.pids]
        _write_runtime(con, f, mine, strings)
        _write_gpu_ops(con, f, mine, strings)
        _write_memory(con, f, [m for m in memory if m.pid in f.pids])
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in strings.items()])
        con.commit()
    finally:
        con.close()


def _write_target(con: sqlite3.Connection, f: ExportFile, strings: _Strings) -> None:
    """Meta data, the target's host and session, its processes and threads, its GPU."""
    write_export_meta(con, f.host, f.generated_by)
    con.executemany(
        "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?, ?, ?)",
        [(VM_ID, "Local (CLI)", name, enum, value) for name, enum, value in f.env],
    )
    con.execute(
        "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)",
        (f.session_utc_ns, f.session_iso, f.session_iso),
    )
    con.execute(
        "INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)",
        (VM_ID, f.duration_ns, 0, f.duration_ns),
    )
    for p in f.processes:
        con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (global_pid(p.pid), p.pid, p.name))
        con.executemany(
            "INSERT INTO ThreadNames VALUES (?, ?, ?)",
            [(strings.id(name), 10, gtid(p.pid, tid)) for tid, name in p.threads],
        )
    if f.gpu_row is not None:
        con.execute(insert("TARGET_INFO_GPU", tuple(f.gpu_row)), tuple(f.gpu_row.values()))


def _nvtx_rows(f: ExportFile, tl: Timeline, strings: _Strings, clock_marks: bool) -> list[tuple]:
    """NVTX_EVENTS rows (``NVTX_COLUMNS``) of the export's processes.

    The driver creates domain ``verl`` (and ``nvtx_phases`` for the sampler's clock marks) and
    marks its ranges with registered strings and the step number as payload; workers mark
    theirs with plain text in the default domain.
    """
    shift = f.shift_ns
    rows: list[tuple] = []
    if DRIVER_PID in f.pids:
        g = gtid(DRIVER_PID, DRIVER_PID)
        rows.append((0, None, NVTX_DOMAIN_CREATE, None, "verl", g, None, _VERL_DOMAIN, None))
        if clock_marks:
            rows.append(
                (0, None, NVTX_DOMAIN_CREATE, None, "nvtx_phases", g, None, _PHASES_DOMAIN, None)
            )
            for t, mono, wall in tl.clock_marks():
                text_id = strings.id(clock_mark_text(mono, wall))
                rows.append(
                    (t - shift, None, NVTX_MARK, None, None, g, text_id, _PHASES_DOMAIN, None)
                )
        for r in tl.driver:
            rows.append(
                (
                    r.start - shift,
                    r.end - shift,
                    NVTX_RANGE,
                    _DRIVER_COLOR,
                    None,
                    g,
                    strings.id(r.name),
                    _VERL_DOMAIN,
                    r.payload,
                )
            )
    for r in tl.workers:
        if r.pid in f.pids:
            row = (r.start - shift, r.end - shift, NVTX_RANGE, None, r.name, gtid(r.pid, r.tid))
            rows.append((*row, None, 0, None))
    return rows


def _write_runtime(
    con: sqlite3.Connection, f: ExportFile, ops: list[GpuOp], strings: _Strings
) -> None:
    """The launch call of each operation (``CUPTI_ACTIVITY_KIND_RUNTIME``)."""
    launch_names = {kind: strings.id(LAUNCH_NAMES[kind]) for kind in f.launch_kinds}
    shift = f.shift_ns
    con.executemany(
        "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)",
        [
            (
                o.call_start - shift,
                o.call_end - shift,
                0,
                gtid(o.pid, o.tid),
                o.correlation,
                launch_names[o.kind],
                0,
                None,
            )
            for o in ops
        ],
    )


def _write_gpu_ops(
    con: sqlite3.Connection, f: ExportFile, ops: list[GpuOp], strings: _Strings
) -> None:
    """Kernels, memcpys, memsets and graph executions, each kind in its CUPTI table."""
    rows: dict[str, list[tuple]] = {"kernel": [], "memcpy": [], "memset": [], "graph": []}
    grid = (f.grid_x, 1, 1, 256, 1, 1, 0, 0, 0, 0)
    for o in ops:
        device = 0 if f.local_device else o.gpu
        common = (
            o.start - f.shift_ns,
            o.end - f.shift_ns,
            device,
            1,
            o.stream,
            o.correlation,
            global_pid(o.pid),
        )
        if o.kind == "kernel":
            short, demangled = o.name
            names = (strings.id(demangled), strings.id(short))
            rows["kernel"].append((*common, *names, 64, *grid, len(rows["kernel"]) + 1))
        elif o.kind == "memcpy":
            rows["memcpy"].append((*common, o.nbytes, o.copy_kind, device, device))
        elif o.kind == "memset":
            rows["memset"].append((*common, 0, o.nbytes, 2))
        else:
            rows["graph"].append((*common, *o.graph))
    con.executemany(insert("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLUMNS), rows["kernel"])
    con.executemany(insert("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_COLUMNS), rows["memcpy"])
    con.executemany(insert("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_COLUMNS), rows["memset"])
    if rows["graph"]:  # exports are lazy: the table exists only where a graph ran
        con.executescript(graph_trace_ddl())
        con.executemany(insert(GRAPH_TRACE_TABLE, GRAPH_COLUMNS), rows["graph"])


def _write_memory(con: sqlite3.Connection, f: ExportFile, events: list[MemoryEvent]) -> None:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` rows, in the order given (nsys's: by time)."""
    if not events:
        return
    rows = [
        (
            m.ts - f.shift_ns,
            global_pid(m.pid),
            0 if f.local_device else m.gpu,
            1,
            m.address,
            0,
            m.nbytes,
            m.mem_kind,
            m.operation,
        )
        for m in events
    ]
    con.executemany(insert(MEMORY_TABLE, MEMORY_COLUMNS), rows)
