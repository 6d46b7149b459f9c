"""A synthetic VeRL-like GRPO run written as real Nsight Systems 2022.4 SQLite exports.

The tables are created from the DDL of a real 2022.4.2 export (``schema/nsys-schema-2022.4.2.sql``,
with its ENUM rows), never from invented columns, so NVIDIA's own ``nsys stats`` reports run on
the result. One driver process marks ``step`` (int64 payload = step number) and the trainer
phases in domain ``verl`` with registered strings; each worker rank marks VeRL's worker phases
with plain text and launches kernels, NCCL collectives, memcpys and memsets on its own GPU.

Deliberate features, each with ground truth: a generation kernel that runs past the end of
``gen`` (split by the window scheme), NCCL kernels on a second stream overlapping compute
(busy time counts overlap once), GPU-free phases (``reward``, ``adv``), warm-up kernels before
the first step (unattributed), response-length skew across ranks, and optionally one file per
process with different session start times (clock alignment). With ``graphs=True`` most decode
kernels of ``generate_sequences`` run as CUDA graph executions instead (``nsys profile
--cuda-graph-trace=graph``: rows of ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``, DDL of nsys 2024.x in
``schema/nsys-graph-trace-2024.sql``, launched by ``cudaGraphLaunch_v10000`` runtime calls), one
of them straddling the ``gen`` boundary. :mod:`analysis.synth.ray` builds a Ray-style capture
(one export per process, two processes sharing each GPU) from the same parts.

The ground truth is computed by brute force from the generated operation list (numpy clipping
per range), independently of :mod:`analysis`.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from nvtx_phases.power import CLOCK_MARK
from nvtx_phases.power import COLUMNS as SAMPLER_COLUMNS

US = 1_000
MS = 1_000_000
VM_ID = 1 << 48
BASE_UTC_NS = 1_790_000_000_000_000_000
DRIVER_PID = 1000
WORKER_PID0 = 2000

#: Trainer phase → (worker range name or None when the phase uses no GPU, length in ms).
GRPO_PHASES: tuple[tuple[str, str | None, float], ...] = (
    ("gen", "generate_sequences", 24.0),
    ("reward", None, 3.0),
    ("old_log_prob", "compute_log_prob", 6.0),
    ("ref", "compute_ref_log_prob", 6.0),
    ("adv", None, 1.0),
    ("update_actor", "update_actor", 16.0),
    ("update_weights", "update_weights", 4.0),
)
#: Extra power (W) a rank draws while its worker range of that phase runs (on top of idle).
PHASE_POWER_W = {
    "generate_sequences": 310.0,
    "compute_log_prob": 230.0,
    "compute_ref_log_prob": 210.0,
    "update_actor": 380.0,
    "update_weights": 160.0,
    "compute_rm_score": 280.0,
}
PHASE_GAP_NS = 200 * US
STEP_GAP_NS = 2 * MS
FIRST_STEP_NS = 5 * MS

COMPUTE_KERNELS = (
    (
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void cutlass::Kernel<gemm_bf16>(Params)",
    ),
    (
        "flash_fwd_kernel",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>(Flash_fwd_params)",
    ),
    (
        "vectorized_elementwise_kernel",
        "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, at::native::AddFunctor<float>)",
    ),
    (
        "reduce_kernel",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(at::native::ReduceOp<float>)",
    ),
)
NCCL_KERNELS = {
    "update_actor": (
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
        "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
    "update_weights": (
        "ncclDevKernel_Broadcast_RING_LL",
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
    "compute_log_prob": (
        "ncclDevKernel_AllGather_RING_LL",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ),
}
COMPUTE_STREAM, NCCL_STREAM, COPY_STREAM = 7, 13, 15
COPY_KIND_H2D, COPY_KIND_D2H, COPY_KIND_D2D, COPY_KIND_P2P = 1, 2, 8, 10
#: Runtime API names of the launch calls, as nsys stores them (``nameId`` → ``StringIds``).
LAUNCH_NAMES = {
    "kernel": "cudaLaunchKernel_v7000",
    "memcpy": "cudaMemcpyAsync_v3020",
    "memset": "cudaMemsetAsync_v3020",
    "graph": "cudaGraphLaunch_v10000",
}
#: (graphId, graphExecId) of the captured decode graphs (one per padded batch size).
DECODE_GRAPHS = ((3, 7), (4, 8))
#: Columns of the sampler's Parquet before it recorded GPU UUIDs; the default synthetic power
#: files keep this layout (an older sampler's file), so the bundled samples stay as they were.
LEGACY_SAMPLER_COLUMNS = tuple(c for c in SAMPLER_COLUMNS if c != "uuid")


@dataclass(frozen=True)
class SynthConfig:
    """Knobs of the synthetic run (defaults: the bundled sample)."""

    steps: int = 3
    ranks: int = 2
    kernels_per_phase: int = 40
    seed: int = 7
    split_files: bool = False
    #: Extra session-start offset of file i (ns) when split; models unsynchronized launches.
    file_start_stagger_ns: int = 3 * MS
    warmup_kernels: int = 4
    #: Rank r's generation lasts (1 - skew * r / ranks) of the longest.
    length_skew: float = 0.35
    #: Write NVML-style power samples (and clock marks in the driver) with known energy.
    power: bool = True
    power_interval_ns: int = 100 * US
    idle_power_w: float = 90.0
    #: The sampler's monotonic clock minus the trace clock; recovered from the clock marks.
    power_mono_offset_ns: int = 987_654_321_000
    #: The sampler host's wall clock minus the trace's (an NTP error the marks make irrelevant).
    power_wall_skew_ns: int = 2_500_000
    clock_mark_every_ns: int = 20 * MS
    #: Write PolyTrace-layout response lengths (``<stem>_lengths/``), rank 0 longest like its
    #: generation time; ``length_cap`` is the rollout's max response length.
    lengths: bool = True
    length_cap: int = 4096
    #: Score rewards with a learned reward model on the GPUs (``compute_rm_score`` in
    #: ``reward``) instead of a rule function on the CPU.
    reward_model: bool = False
    #: Run most decode kernels of ``generate_sequences`` as CUDA graph executions
    #: (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``), the straddling one included.
    graphs: bool = False


@dataclass
class _Ops:
    """Column lists of generated GPU operations (one entry per op)."""

    kind: list[str]
    pid: list[int]
    device: list[int]
    stream: list[int]
    start: list[int]
    end: list[int]
    name: list[tuple[str, str]]
    bytes: list[int]
    copy_kind: list[int]
    launch_tid: list[int]
    call_start: list[int]
    call_end: list[int]
    correlation: list[int]
    worker_range: list[int]  # index into worker ranges, -1 when launched outside any
    graph: list[tuple[int, int]]  # (graphId, graphExecId) of a graph execution, else (0, 0)


def _empty_ops() -> _Ops:
    return _Ops(*([] for _ in range(15)))


@dataclass
class _Range:
    pid: int
    tid: int
    name: str
    start: int
    end: int
    payload: int | None
    path: str
    step: int | None


class _Builder:
    def __init__(self, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.ops = _empty_ops()
        self.driver: list[_Range] = []
        self.workers: list[_Range] = []
        self.next_corr = {WORKER_PID0 + r: 1 for r in range(cfg.ranks)}

    def add_op(
        self,
        *,
        kind,
        rank,
        stream,
        start,
        end,
        name,
        nbytes=0,
        copy_kind=0,
        call_start,
        worker_range,
        graph=(0, 0),
    ) -> None:
        pid = WORKER_PID0 + rank
        o = self.ops
        o.kind.append(kind)
        o.pid.append(pid)
        o.device.append(rank)
        o.stream.append(stream)
        o.start.append(int(start))
        o.end.append(int(end))
        o.name.append(name)
        o.bytes.append(int(nbytes))
        o.copy_kind.append(copy_kind)
        o.launch_tid.append(pid)
        o.call_start.append(int(call_start))
        o.call_end.append(int(call_start) + 4 * US)
        o.correlation.append(self.next_corr[pid])
        self.next_corr[pid] += 1
        o.worker_range.append(worker_range)
        o.graph.append(graph)

    def decode_kind(self, name: str, i: int) -> tuple[str, tuple[int, int]]:
        """Kind and graph ids of compute kernel ``i`` of a worker range (graphs: see config)."""
        if self.cfg.graphs and name == "generate_sequences" and i >= 2 and i % 4 != 3:
            return "graph", DECODE_GRAPHS[i % 2]  # prefill and every 4th (sampling) stay eager
        return "kernel", (0, 0)

    def worker_phase(
        self, rank: int, name: str, w_start: int, w_end: int, step: int, *, straddle_to: int | None
    ) -> None:
        pid = WORKER_PID0 + rank
        idx = len(self.workers)
        self.workers.append(_Range(pid, pid, name, w_start, w_end, None, name, step))
        rng = self.rng
        k = self.cfg.kernels_per_phase
        # H2D copy of the batch, then a memset of the output buffer
        t = w_start + 10 * US
        self.add_op(
            kind="memcpy",
            rank=rank,
            stream=COPY_STREAM,
            start=t + 15 * US,
            end=t + 65 * US,
            name=("", ""),
            nbytes=8 << 20,
            copy_kind=COPY_KIND_H2D,
            call_start=t,
            worker_range=idx,
        )
        t += 70 * US
        self.add_op(
            kind="memset",
            rank=rank,
            stream=COMPUTE_STREAM,
            start=t + 10 * US,
            end=t + 14 * US,
            name=("", ""),
            nbytes=1 << 20,
            call_start=t,
            worker_range=idx,
        )
        t += 20 * US
        body_end = w_end - 150 * US
        weights = rng.uniform(0.5, 1.5, size=k)
        usable = body_end - t - k * 6 * US  # each kernel starts 6 us after its launch call
        durations = (weights / weights.sum() * usable * 0.8).astype(np.int64)
        gaps = (usable * 0.2 / k) // 1
        cursor = t
        starts, ends = [], []
        for i in range(k):
            call = cursor
            s = cursor + 6 * US
            e = s + int(durations[i])
            starts.append(s)
            ends.append(e)
            kind, graph = self.decode_kind(name, i)
            self.add_op(
                kind=kind,
                rank=rank,
                stream=COMPUTE_STREAM,
                start=s,
                end=e,
                name=COMPUTE_KERNELS[i % len(COMPUTE_KERNELS)] if kind == "kernel" else ("", ""),
                call_start=call,
                worker_range=idx,
                graph=graph,
            )
            cursor = e + int(gaps)
        if straddle_to is not None:
            # an async kernel launched at the end of the range that runs into the next phase
            call = ends[-1] + 2 * US
            graph = self.cfg.graphs and name == "generate_sequences"  # a decode step
            self.add_op(
                kind="graph" if graph else "kernel",
                rank=rank,
                stream=COMPUTE_STREAM,
                start=ends[-1] + 8 * US,
                end=straddle_to,
                name=("", "") if graph else COMPUTE_KERNELS[0],
                call_start=call,
                worker_range=idx,
                graph=DECODE_GRAPHS[0] if graph else (0, 0),
            )
        if name in NCCL_KERNELS:
            # collectives on their own stream, overlapping compute kernels
            for j in range(k // 2, k, max(1, k // 4)):
                s = starts[j] + durations[j] // 3
                e = s + int(durations[j])
                self.add_op(
                    kind="kernel",
                    rank=rank,
                    stream=NCCL_STREAM,
                    start=s,
                    end=e,
                    name=NCCL_KERNELS[name],
                    call_start=starts[j] - 5 * US,
                    worker_range=idx,
                )
        if name == "compute_log_prob":
            s = w_end - 140 * US
            self.add_op(
                kind="memcpy",
                rank=rank,
                stream=COPY_STREAM,
                start=s,
                end=s + 30 * US,
                name=("", ""),
                nbytes=2 << 20,
                copy_kind=COPY_KIND_D2D,
                call_start=s - 8 * US,
                worker_range=idx,
            )
        if name == "update_weights":
            s = w_end - 140 * US
            self.add_op(
                kind="memcpy",
                rank=rank,
                stream=COPY_STREAM,
                start=s,
                end=s + 60 * US,
                name=("", ""),
                nbytes=64 << 20,
                copy_kind=COPY_KIND_P2P,
                call_start=s - 8 * US,
                worker_range=idx,
            )
        # D2H of the results
        s = w_end - 60 * US
        self.add_op(
            kind="memcpy",
            rank=rank,
            stream=COPY_STREAM,
            start=s,
            end=s + 40 * US,
            name=("", ""),
            nbytes=1 << 20,
            copy_kind=COPY_KIND_D2H,
            call_start=s - 8 * US,
            worker_range=idx,
        )

    @property
    def duration(self) -> int:
        return max(max(self.ops.end), max(r.end for r in self.driver)) + 1 * MS

    def power_at(self, device: int, t: np.ndarray) -> np.ndarray:
        """True power (W) of ``device`` at instants ``t``: idle + level of its running phase."""
        power = np.full(t.shape, self.cfg.idle_power_w)
        for r in self.workers:
            if r.pid == WORKER_PID0 + device:
                power += np.where((t >= r.start) & (t < r.end), PHASE_POWER_W.get(r.name, 0.0), 0.0)
        return power

    def energy_j(self, device: int, start: int, end: int) -> float:
        """Exact integral of :meth:`power_at` over [start, end] (J)."""
        total = self.cfg.idle_power_w * (end - start)
        for r in self.workers:
            if r.pid == WORKER_PID0 + device:
                overlap = max(0, min(end, r.end) - max(start, r.start))
                total += PHASE_POWER_W.get(r.name, 0.0) * overlap
        return total / 1e9

    def sample_times(self) -> np.ndarray:
        return np.arange(0, self.duration + 1, self.cfg.power_interval_ns, dtype=np.int64)

    def clock_marks(self) -> list[tuple[int, int, int]]:
        """(trace ns, sampler mono ns, sampler wall ns) of each clock mark."""
        cfg = self.cfg
        times = [*range(0, self.duration, cfg.clock_mark_every_ns), self.duration]
        return [
            (t, t + cfg.power_mono_offset_ns, BASE_UTC_NS + t + cfg.power_wall_skew_ns)
            for t in times
        ]

    def power_samples(self) -> dict[str, list]:
        """NVML-sampler layout: per device and instant, power and an exact energy counter (mJ)."""
        cfg = self.cfg
        t = self.sample_times()
        columns: dict[str, list] = {c: [] for c in LEGACY_SAMPLER_COLUMNS}  # an older sampler's
        for device in range(cfg.ranks):
            power = self.power_at(device, t)
            counter_mj = self.cumulative_energy_j(device, t) * 1000.0
            n = len(t)
            columns["host"] += ["synthetic"] * n
            columns["pid"] += [DRIVER_PID] * n
            columns["device"] += [device] * n
            columns["wall_ns"] += (BASE_UTC_NS + t + cfg.power_wall_skew_ns).tolist()
            columns["mono_ns"] += (t + cfg.power_mono_offset_ns).tolist()
            columns["power_w"] += power.tolist()
            columns["energy_mj"] += np.round(counter_mj).astype(np.int64).tolist()
            columns["sm_clock_mhz"] += [1980] * n
            columns["gpu_util_pct"] += np.where(power > cfg.idle_power_w, 100, 0).tolist()
            columns["mem_util_pct"] += [0] * n
        return columns

    def cumulative_energy_j(self, device: int, t: np.ndarray) -> np.ndarray:
        """Energy (J) from instant 0 to each of ``t`` (exact, vectorized over instants)."""
        total = self.cfg.idle_power_w * t.astype(np.float64)
        for r in self.workers:
            if r.pid == WORKER_PID0 + device:
                total += PHASE_POWER_W.get(r.name, 0.0) * np.clip(t - r.start, 0, r.end - r.start)
        return total / 1e9

    def build(self) -> None:
        cfg = self.cfg
        for r in range(cfg.ranks):  # warm-up before the first step, outside every range
            for i in range(cfg.warmup_kernels):
                s = 1 * MS + i * 200 * US
                self.add_op(
                    kind="kernel",
                    rank=r,
                    stream=COMPUTE_STREAM,
                    start=s,
                    end=s + 100 * US,
                    name=COMPUTE_KERNELS[2],
                    call_start=s - 20 * US,
                    worker_range=-1,
                )
        t = FIRST_STEP_NS
        for step in range(1, cfg.steps + 1):
            step_start = t
            t += 50 * US
            phases = []
            for p, (phase, worker, length_ms) in enumerate(GRPO_PHASES):
                p_start = t
                p_end = p_start + int(length_ms * MS * self.rng.uniform(0.9, 1.1))
                phases.append((phase, p_start, p_end))
                next_start = p_end + PHASE_GAP_NS
                if phase == "reward" and cfg.reward_model:
                    worker = "compute_rm_score"
                if worker is not None:
                    for r in range(cfg.ranks):
                        span = p_end - p_start - 300 * US
                        if phase == "gen":
                            span = int(span * (1 - cfg.length_skew * r / cfg.ranks))
                        w_start = p_start + 100 * US
                        straddle = None
                        if phase == "gen" and r == 0 and p + 1 < len(GRPO_PHASES):
                            straddle = next_start + 300 * US  # into the next phase
                        self.worker_phase(
                            r, worker, w_start, w_start + span, step, straddle_to=straddle
                        )
                t = next_start
            step_end = t + 100 * US
            self.driver.append(
                _Range(DRIVER_PID, DRIVER_PID, "step", step_start, step_end, step, "step", step)
            )
            for phase, s, e in phases:
                self.driver.append(
                    _Range(DRIVER_PID, DRIVER_PID, phase, s, e, None, f"step/{phase}", step)
                )
            t = step_end + STEP_GAP_NS


def _ddl(tables: set[str]) -> str:
    text = resources.files("analysis.synth").joinpath("schema/nsys-schema-2022.4.2.sql").read_text()
    blocks = re.findall(r"CREATE TABLE (\w+) \(.*?\n\);", text, flags=re.S)
    statements = re.findall(r"(CREATE TABLE \w+ \(.*?\n\);)", text, flags=re.S)
    chosen = [
        st
        for name, st in zip(blocks, statements, strict=True)
        if name in tables or name.startswith("ENUM_")
    ]
    return "\n".join(chosen)


GRAPH_TRACE_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


def graph_trace_ddl() -> str:
    """``CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` as nsys 2024.x writes it."""
    text = (
        resources.files("analysis.synth").joinpath("schema/nsys-graph-trace-2024.sql").read_text()
    )
    (statement,) = re.findall(r"(CREATE TABLE \w+ \(.*?\n\);)", text, flags=re.S)
    return statement


def _enum_rows() -> str:
    return resources.files("analysis.synth").joinpath("schema/nsys-enums-2022.4.2.sql").read_text()


TABLES = {
    "ANALYSIS_DETAILS",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "EXPORT_META_DATA",
    "NVTX_EVENTS",
    "PROCESSES",
    "StringIds",
    "TARGET_INFO_SESSION_START_TIME",
    "ThreadNames",
    "TARGET_INFO_SYSTEM_ENV",
}


_GPU_COMMON = ("start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid")
_KERNEL_COLUMNS = (
    *_GPU_COMMON,
    "demangledName",
    "shortName",
    "registersPerThread",
    "gridX",
    "gridY",
    "gridZ",
    "blockX",
    "blockY",
    "blockZ",
    "staticSharedMemory",
    "dynamicSharedMemory",
    "localMemoryPerThread",
    "localMemoryTotal",
    "gridId",
)
_MEMCPY_COLUMNS = (*_GPU_COMMON, "bytes", "copyKind", "srcDeviceId", "dstDeviceId")
_MEMSET_COLUMNS = (*_GPU_COMMON, "value", "bytes", "memKind")
_GRAPH_COLUMNS = (*_GPU_COMMON, "graphId", "graphExecId")


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _gtid(pid: int, tid: int) -> int:
    return VM_ID | (pid << 24) | tid


def _write_file(
    path: Path, b: _Builder, pids: list[int], shift_ns: int, session_utc_ns: int, duration_ns: int
) -> None:
    """Write the events of ``pids`` to one export whose session starts at ``session_utc_ns``."""
    if path.exists():
        path.unlink()
    con = sqlite3.connect(path)
    try:
        con.executescript(_ddl(TABLES))
        con.executescript(_enum_rows())
        strings: dict[str, int] = {}

        def sid(text: str) -> int:
            if text not in strings:
                strings[text] = len(strings)
            return strings[text]

        sid("[Unknown]")
        write_export_meta(
            con, "synthetic", "nvtx-phases analysis.synth.build (synthetic VeRL-like GRPO run)"
        )
        con.execute(
            "INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (?, ?, ?, ?, ?)",
            (VM_ID, "Local (CLI)", "Hostname", 619, "synthetic"),
        )
        con.execute(
            "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, ?, ?)", (session_utc_ns, "", "")
        )
        con.execute(
            "INSERT INTO ANALYSIS_DETAILS VALUES (?, ?, ?, ?)", (VM_ID, duration_ns, 0, duration_ns)
        )
        for pid in pids:
            name = (
                "python3 main_ppo.py (driver)"
                if pid == DRIVER_PID
                else f"ray::WorkerDict rank {pid - WORKER_PID0}"
            )
            con.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (VM_ID | (pid << 24), pid, name))
            con.execute(
                "INSERT INTO ThreadNames VALUES (?, ?, ?)", (sid(name), 10, _gtid(pid, pid))
            )

        nvtx = []
        if DRIVER_PID in pids:
            g = _gtid(DRIVER_PID, DRIVER_PID)
            nvtx.append((0 - 0, None, 75, None, None, None, "verl", g, None, None, 1, None, None))
            if b.cfg.power:  # the sampler ran in the driver process: its clock marks are here
                nvtx.append(
                    (0, None, 75, None, None, None, "nvtx_phases", g, None, None, 2, None, None)
                )
                for t, mono, wall in b.clock_marks():
                    text = f"{CLOCK_MARK} mono_ns={mono} wall_ns={wall}"
                    nvtx.append(
                        (
                            t - shift_ns,
                            None,
                            34,
                            None,
                            None,
                            None,
                            None,
                            g,
                            None,
                            sid(text),
                            2,
                            None,
                            None,
                        )
                    )
            for r in b.driver:  # registered strings (textId), domain "verl", step payload
                nvtx.append(
                    (
                        r.start - shift_ns,
                        r.end - shift_ns,
                        59,
                        None,
                        None,
                        0xFF00FF00,
                        None,
                        g,
                        None,
                        sid(r.name),
                        1,
                        None,
                        r.payload,
                    )
                )
        for r in b.workers:
            if r.pid in pids:
                nvtx.append(
                    (
                        r.start - shift_ns,
                        r.end - shift_ns,
                        59,
                        None,
                        None,
                        None,
                        r.name,
                        _gtid(r.pid, r.tid),
                        None,
                        None,
                        0,
                        None,
                        None,
                    )
                )
        con.executemany(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, rangeId, category, color, text, globalTid, "
            "endGlobalTid, textId, domainId, uint64Value, int64Value) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            nvtx,
        )
        o = b.ops
        idx = [i for i, p in enumerate(o.pid) if p in pids]
        kinds = ("kernel", "memcpy", "memset", *(["graph"] if b.cfg.graphs else []))
        launch_names = {kind: sid(LAUNCH_NAMES[kind]) for kind in kinds}
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)",
            [
                (
                    o.call_start[i] - shift_ns,
                    o.call_end[i] - shift_ns,
                    0,
                    _gtid(o.pid[i], o.launch_tid[i]),
                    o.correlation[i],
                    launch_names[o.kind[i]],
                    0,
                    None,
                )
                for i in idx
            ],
        )
        kernels, memcpys, memsets, graphs = [], [], [], []
        for i in idx:
            common = (
                o.start[i] - shift_ns,
                o.end[i] - shift_ns,
                o.device[i],
                1,
                o.stream[i],
                o.correlation[i],
                VM_ID | (o.pid[i] << 24),
            )
            if o.kind[i] == "kernel":
                short, demangled = o.name[i]
                kernels.append(
                    (
                        *common,
                        sid(demangled),
                        sid(short),
                        64,
                        108,
                        1,
                        1,
                        256,
                        1,
                        1,
                        0,
                        0,
                        0,
                        0,
                        len(kernels) + 1,
                    )
                )
            elif o.kind[i] == "memcpy":
                memcpys.append((*common, o.bytes[i], o.copy_kind[i], o.device[i], o.device[i]))
            elif o.kind[i] == "graph":
                graphs.append((*common, *o.graph[i]))
            else:
                memsets.append((*common, 0, o.bytes[i], 2))
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_KERNEL", _KERNEL_COLUMNS), kernels)
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_MEMCPY", _MEMCPY_COLUMNS), memcpys)
        con.executemany(_insert("CUPTI_ACTIVITY_KIND_MEMSET", _MEMSET_COLUMNS), memsets)
        if graphs:  # exports are lazy: the table exists only where a graph ran
            con.executescript(graph_trace_ddl())
            con.executemany(_insert(GRAPH_TRACE_TABLE, _GRAPH_COLUMNS), graphs)
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(v, k) for k, v in strings.items()])
        con.commit()
    finally:
        con.close()


def _union(starts: np.ndarray, ends: np.ndarray) -> int:
    """Brute-force union length (independent of analysis.attribute.intervals)."""
    total, reach = 0, None
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def ground_truth(b: _Builder) -> dict:
    """Expected phase metrics, computed by clipping every op to every range (numpy)."""
    o = b.ops
    start = np.array(o.start)
    end = np.array(o.end)
    kind = np.array(o.kind)
    device = np.array(o.device)
    nbytes = np.array(o.bytes)
    is_nccl = np.array([n[0].startswith("nccl") for n in o.name])
    wr = np.array(o.worker_range)
    devices = sorted(set(o.device))

    def metrics(s: int, e: int, mask: np.ndarray, clip: bool) -> dict:
        cs = np.maximum(start, s) if clip else start
        ce = np.minimum(end, e) if clip else end
        dur = np.where(mask, np.clip(ce - cs, 0, None), 0)
        counted = mask & ((start >= s) & (start < e) if clip else True)
        bs, be = np.maximum(start, s), np.minimum(end, e)
        busy_mask = mask & (be > bs)
        busy = sum(
            _union(bs[busy_mask & (device == d)], be[busy_mask & (device == d)]) for d in devices
        )
        graph = (  # only with graphs: the default ground truth keeps its layout
            {
                "graph_ns": int(dur[kind == "graph"].sum()),
                "n_graphs": int((counted & (kind == "graph")).sum()),
            }
            if b.cfg.graphs
            else {}
        )
        return {
            "kernel_ns": int(dur[kind == "kernel"].sum()),
            "nccl_ns": int(dur[(kind == "kernel") & is_nccl].sum()),
            "memcpy_ns": int(dur[kind == "memcpy"].sum()),
            "memcpy_bytes": int(nbytes[counted & (kind == "memcpy")].sum()),
            "memset_ns": int(dur[kind == "memset"].sum()),
            "n_kernels": int((counted & (kind == "kernel")).sum()),
            **graph,
            "gpu_busy_ns": int(busy),
        }

    everything = np.ones(len(start), dtype=bool)
    driver = [
        {
            "step": r.step,
            "phase": r.name,
            "path": r.path,
            "wall_ns": r.end - r.start,
            **metrics(r.start, r.end, everything, clip=True),
        }
        for r in b.driver
    ]
    workers = [
        {
            "pid": r.pid,
            "step": r.step,
            "phase": r.name,
            "path": r.path,
            "start_ns": r.start,
            "end_ns": r.end,
            "wall_ns": r.end - r.start,
            **metrics(r.start, r.end, wr == i, clip=False),
        }
        for i, r in enumerate(b.workers)
    ]
    # window conservation: innermost driver range = the phase if inside one, else the step
    inner = sorted((r.start, r.end) for r in b.driver if r.name != "step")
    steps = sorted((r.start, r.end) for r in b.driver if r.name == "step")
    in_phase = sum(
        int(np.clip(np.minimum(end, e) - np.maximum(start, s), 0, None).sum()) for s, e in inner
    )
    in_step = sum(
        int(np.clip(np.minimum(end, e) - np.maximum(start, s), 0, None).sum()) for s, e in steps
    )
    total = int((end - start).sum())
    kernels: dict[str, dict[str, int]] = {}
    for i in np.flatnonzero(kind == "kernel"):
        entry = kernels.setdefault(o.name[i][1], {"count": 0, "total_ns": 0})
        entry["count"] += 1
        entry["total_ns"] += int(end[i] - start[i])
    return {
        "total_gpu_ns": total,
        "window_attributed_gpu_ns": in_step,  # phases and the gaps between them lie inside steps
        "window_in_phase_gpu_ns": in_phase,
        "window_unattributed_gpu_ns": total - in_step,
        "projection_attributed_gpu_ns": int((end - start)[wr >= 0].sum()),
        "projection_unattributed_gpu_ns": int((end - start)[wr < 0].sum()),
        "n_gpu_ops": len(start),
        "n_kernels": int((kind == "kernel").sum()),
        "n_steps": b.cfg.steps,
        **(_graph_totals(kind, start, end) if b.cfg.graphs else {}),
        "driver_phases": driver,
        "worker_phases": workers,
        "kernels": kernels,
        **(_energy_truth(b) if b.cfg.power else {}),
    }


GRAPH_NOTE = (
    "A CUDA graph execution (CUPTI_ACTIVITY_KIND_GRAPH_TRACE row, launched by "
    "cudaGraphLaunch_v10000) is one GPU operation of class cuda_graph: its time is counted in "
    "total_gpu_ns, gpu_busy_ns and graph_ns, never in kernel_ns or n_kernels (its kernels are "
    "not listed), and graphs are not in the kernels table."
)


def _graph_totals(kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict:
    """Run totals of graph executions, and the note that says how they are counted."""
    graph = kind == "graph"
    return {
        "graph_ns": int((end - start)[graph].sum()),
        "n_graphs": int(graph.sum()),
        "notes": [GRAPH_NOTE],
    }


def write_lengths(
    cfg: SynthConfig, folder: Path, *, prompts: int = 8, n_sampling: int = 4
) -> list[Path]:
    """Write ``packed_lengths_step_{S}.jsonl`` per step in PolyTrace's layout.

    Per rank, lognormal response lengths whose scale follows the rank's generation time (rank 0
    longest), capped at ``cfg.length_cap``.
    """
    rng = np.random.default_rng(cfg.seed + 1000)  # its own stream: the trace stays as it was
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for step in range(1, cfg.steps + 1):
        lines = []
        for rank in range(cfg.ranks):
            scale = 600.0 * (1 - cfg.length_skew * rank / cfg.ranks)
            for index in range(prompts):
                outputs = np.minimum(
                    np.rint(rng.lognormal(np.log(scale), 0.6, n_sampling)), cfg.length_cap
                )
                row = {
                    "step": step,
                    "rank": rank,
                    "dp_rank": rank,
                    "tp_rank": 0,
                    "local_index": index,
                    "input": int(rng.integers(200, 800)),
                    "output": [int(max(o, 1)) for o in outputs],
                    "n_sampling": n_sampling,
                    "validate": False,
                }
                lines.append(json.dumps(row))
        path = folder / f"packed_lengths_step_{step}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def _energy_truth(b: _Builder) -> dict:
    """Exact energy per driver range and device, and totals, from the power model."""
    devices = range(b.cfg.ranks)
    last = int(b.sample_times()[-1])
    per_range = [
        {
            "step": r.step,
            "path": r.path,
            "energy_j": sum(b.energy_j(d, r.start, r.end) for d in devices),
            "per_device_j": [b.energy_j(d, r.start, r.end) for d in devices],
        }
        for r in b.driver
    ]
    steps = [r for r in b.driver if r.name == "step"]
    total = sum(b.energy_j(d, 0, last) for d in devices)
    in_steps = sum(b.energy_j(d, r.start, r.end) for d in devices for r in steps)
    return {
        "energy": {
            "idle_power_w": b.cfg.idle_power_w,
            "total_energy_j": total,
            "attributed_energy_j": in_steps,
            "unattributed_energy_j": total - in_steps,
            "driver_phases": per_range,
        }
    }


def generate(
    out: str | Path, cfg: SynthConfig | None = None, *, with_truth: bool = True
) -> list[Path]:
    """Write the synthetic run and its ground truth; return the export paths.

    One export when ``out`` is a ``.sqlite`` path, or one per process with ``cfg.split_files``
    (``out`` is then a folder). The ground truth JSON is written beside the export(s).
    """
    cfg = cfg or SynthConfig()
    b = _Builder(cfg)
    b.build()
    out = Path(out)
    duration = b.duration
    pids = [DRIVER_PID] + [WORKER_PID0 + r for r in range(cfg.ranks)]
    written: list[Path] = []
    if cfg.split_files:
        out.mkdir(parents=True, exist_ok=True)
        for i, pid in enumerate(pids):
            shift = i * cfg.file_start_stagger_ns  # this process's capture started later
            name = "driver" if pid == DRIVER_PID else f"worker_rank{pid - WORKER_PID0}"
            path = out / f"{name}.sqlite"
            _write_file(path, b, [pid], shift, BASE_UTC_NS + shift, duration - shift)
            written.append(path)
        truth_path = out / "ground_truth.json"
        power_path = out / "power_synthetic.parquet"
        lengths_dir = out / "lengths"
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        _write_file(out, b, pids, 0, BASE_UTC_NS, duration)
        written.append(out)
        truth_path = out.with_name(out.stem + ".ground_truth.json")
        power_path = out.with_name(out.stem + ".power.parquet")
        lengths_dir = out.with_name(out.stem + "_lengths")
    if cfg.lengths:
        write_lengths(cfg, lengths_dir)
    if cfg.power:
        import polars as pl

        small_ints = ("device", "sm_clock_mhz", "gpu_util_pct", "mem_util_pct")
        frame = pl.DataFrame(b.power_samples()).cast({c: pl.Int32 for c in small_ints})
        frame.write_parquet(power_path)
    if with_truth:
        config = asdict(cfg)
        if not cfg.graphs:  # added later: absent when off, so older ground truths stay as they are
            del config["graphs"]
        truth = {"config": config, **ground_truth(b)}
        truth_path.write_text(json.dumps(truth, indent=1) + "\n")
    return written


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
