"""The Ray capture's timeline: processes, GPU operations, ranges and the power model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from analysis.synth.build import (
    BASE_UTC_NS,
    COMPUTE_KERNELS,
    COMPUTE_STREAM,
    COPY_KIND_D2D,
    COPY_KIND_D2H,
    COPY_KIND_H2D,
    COPY_STREAM,
    DRIVER_PID,
    MS,
    NCCL_KERNELS,
    NCCL_STREAM,
    PHASE_GAP_NS,
    PHASE_POWER_W,
    STEP_GAP_NS,
    US,
    _Range,
)
from nvtx_phases.power import PowerSampler

TRAINER_PID0 = 2000
ROLLOUT_PID0 = 3000
#: The rollout server launches from its engine thread, not its main thread.
ROLLOUT_TID_OFFSET = 1
#: Trainer phase → (trainer worker range or None, length in ms). ``gen`` is the rollout's.
RAY_PHASES: tuple[tuple[str, str | None, float], ...] = (
    ("gen", None, 20.0),
    ("reward", None, 3.0),
    ("old_log_prob", "compute_log_prob", 8.0),
    ("adv", None, 1.0),
    ("update_actor", "update_actor", 14.0),
    ("update_weights", "update_weights", 4.0),
)
DECODE_KERNEL = (
    "flash_fwd_splitkv_kernel",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>, true>(Flash_fwd_params)",
)
#: (graphId, graphExecId) of the rollout's decode graphs: batch 64 while every request runs,
#: batch 32 once half of them have finished.
RAY_DECODE_GRAPHS = ((11, 21), (12, 22))
OpKind = Literal["kernel", "memcpy", "memset", "graph"]
ROLLOUT_POWER_W = 300.0
#: PCI bus locations of an HGX H100 board's eight GPUs, in order.
BUS_LOCATIONS = tuple(f"0000:{b}:00.0" for b in ("19", "3b", "4c", "5d", "9b", "bb", "cb", "db"))


@dataclass(frozen=True)
class RayConfig:
    """Knobs of the synthetic Ray capture (defaults: 2 steps, 2 GPUs, about 750 operations)."""

    steps: int = 2
    #: Physical GPUs on the one host; each runs a trainer worker and a rollout server process.
    gpus: int = 2
    seed: int = 5
    #: Compute kernels per trainer worker range.
    kernels_per_phase: int = 32
    #: Decode steps per ``gen`` on GPU 0 (fewer on the others: ``length_skew``).
    decode_steps: int = 64
    #: GPU g generates for (1 - skew * g / gpus) of GPU 0's time.
    length_skew: float = 0.3
    #: Run decode steps as CUDA graph executions (else as eager kernels).
    graphs: bool = True
    #: Mark ``generate_sequences`` around the rollout's generation (an inference server does not).
    rollout_ranges: bool = False
    host: str = "ray-h100-node-0"
    #: Process k (driver 0, then trainer and rollout of each GPU) starts its capture about
    #: k times this later than the driver.
    session_stagger_ns: int = 700 * US
    #: Write NVML power samples of every GPU (``power_nvml.parquet``, sampler in the driver).
    power: bool = True
    power_interval_ns: int = 100 * US
    idle_power_w: float = 70.0
    power_mono_offset_ns: int = 123_456_789_000
    power_wall_skew_ns: int = 1_500_000
    clock_mark_every_ns: int = 20 * MS


@dataclass
class RayOp:
    """One GPU operation on the run clock (the driver's session clock), on a physical GPU."""

    kind: OpKind
    pid: int
    tid: int
    gpu: int  # physical GPU index on the host; every export calls it deviceId 0
    stream: int
    start: int
    end: int
    call_start: int
    correlation: int
    name: tuple[str, str] = ("", "")  # (short, demangled) for kernels
    nbytes: int = 0
    copy_kind: int = 0
    worker_range: int = -1  # index into the worker ranges enclosing the launch call, else -1
    graph: tuple[int, int] = (0, 0)  # (graphId, graphExecId) of a graph execution


@dataclass(frozen=True)
class RayProcess:
    """One profiled process: one export file."""

    pid: int
    role: Literal["driver", "trainer", "rollout"]
    gpu: int | None
    name: str
    threads: tuple[tuple[int, str], ...]
    file: str
    shift_ns: int  # its session started this much later than the driver's


def nsys_uuid(rng: np.random.Generator) -> str:
    """A GPU UUID as nsys stores it in ``TARGET_INFO_GPU.uuid`` (no ``GPU-`` prefix)."""
    h = rng.bytes(16).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def device_name(uuid: str) -> str:
    """The physical GPU's name in the ground truth: NVML's spelling ``GPU-<uuid>``."""
    return f"GPU-{uuid}"


@dataclass
class RayBuilder:
    """The generated run: processes, driver and worker ranges, GPU operations, power windows."""

    cfg: RayConfig
    rng: np.random.Generator = field(init=False)
    uuids: list[str] = field(init=False)
    processes: list[RayProcess] = field(init=False)
    ops: list[RayOp] = field(default_factory=list)
    driver: list[_Range] = field(default_factory=list)
    workers: list[_Range] = field(default_factory=list)
    #: (gpu, start, end, extra watts) of what draws power, for the power model.
    activity: list[tuple[int, int, int, float]] = field(default_factory=list)
    next_corr: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cfg = self.cfg
        if cfg.gpus < 1 or cfg.gpus > len(BUS_LOCATIONS) or cfg.steps < 1:
            msg = f"gpus must be 1..{len(BUS_LOCATIONS)} and steps ≥ 1"
            raise ValueError(msg)
        self.uuids = [nsys_uuid(np.random.default_rng([cfg.seed, g])) for g in range(cfg.gpus)]
        self.rng = np.random.default_rng(cfg.seed)
        self.processes = [
            RayProcess(
                DRIVER_PID,
                "driver",
                None,
                "python3 -m verl.trainer.main_ppo",
                ((DRIVER_PID, "python3"),),
                "driver.sqlite",
                0,
            )
        ]
        k = 1
        for g in range(cfg.gpus):
            jitter = [int(j) for j in self.rng.integers(0, 97 * US, size=2)]
            t_pid, r_pid = TRAINER_PID0 + g, ROLLOUT_PID0 + g
            self.processes += [
                RayProcess(
                    t_pid,
                    "trainer",
                    g,
                    "ray::WorkerDict",
                    ((t_pid, "ray::WorkerDict"),),
                    f"trainer_gpu{g}.sqlite",
                    k * cfg.session_stagger_ns + jitter[0],
                ),
                RayProcess(
                    r_pid,
                    "rollout",
                    g,
                    "ray::vLLMHttpServer",
                    ((r_pid, "ray::vLLMHttpServer"), (r_pid + ROLLOUT_TID_OFFSET, "EngineCore")),
                    f"rollout_gpu{g}.sqlite",
                    (k + 1) * cfg.session_stagger_ns + jitter[1],
                ),
            ]
            k += 2
        self.next_corr = {p.pid: 1 for p in self.processes}

    # --- operations ---------------------------------------------------------------------------

    def op(
        self,
        kind: OpKind,
        pid: int,
        gpu: int,
        start: int,
        end: int,
        *,
        stream: int = COMPUTE_STREAM,
        call_start: int | None = None,
        name: tuple[str, str] = ("", ""),
        nbytes: int = 0,
        copy_kind: int = 0,
        worker_range: int = -1,
        graph: tuple[int, int] = (0, 0),
    ) -> RayOp:
        """Add one operation launched ``call_start`` (default 6 µs before it starts)."""
        tid = pid + ROLLOUT_TID_OFFSET if pid >= ROLLOUT_PID0 else pid
        o = RayOp(
            kind=kind,
            pid=pid,
            tid=tid,
            gpu=gpu,
            stream=stream,
            start=int(start),
            end=int(end),
            call_start=int(start - 6 * US if call_start is None else call_start),
            correlation=self.next_corr[pid],
            name=name,
            nbytes=nbytes,
            copy_kind=copy_kind,
            worker_range=worker_range,
            graph=graph,
        )
        self.next_corr[pid] += 1
        self.ops.append(o)
        return o

    def trainer_range(self, g: int, name: str, w_start: int, w_end: int, step: int) -> None:
        """A trainer worker range: copies, a memset, compute kernels, NCCL overlapping them."""
        pid = TRAINER_PID0 + g
        idx = len(self.workers)
        self.workers.append(_Range(pid, pid, name, w_start, w_end, None, name, step))
        self.activity.append((g, w_start, w_end, PHASE_POWER_W[name]))
        k = self.cfg.kernels_per_phase
        t = w_start + 10 * US
        self.op(
            "memcpy",
            pid,
            g,
            t + 15 * US,
            t + 65 * US,
            stream=COPY_STREAM,
            call_start=t,
            nbytes=8 << 20,
            copy_kind=COPY_KIND_H2D,
            worker_range=idx,
        )
        t += 70 * US
        self.op(
            "memset",
            pid,
            g,
            t + 10 * US,
            t + 14 * US,
            call_start=t,
            nbytes=1 << 20,
            worker_range=idx,
        )
        t += 20 * US
        usable = w_end - 150 * US - t - k * 6 * US
        weights = self.rng.uniform(0.5, 1.5, size=k)
        durations = (weights / weights.sum() * usable * 0.8).astype(np.int64)
        gap = int(usable * 0.2 / k)
        cursor, starts = t, []
        for i in range(k):
            s = cursor + 6 * US
            e = s + int(durations[i])
            starts.append(s)
            self.op(
                "kernel",
                pid,
                g,
                s,
                e,
                call_start=cursor,
                name=COMPUTE_KERNELS[i % len(COMPUTE_KERNELS)],
                worker_range=idx,
            )
            cursor = e + gap
        if name in NCCL_KERNELS:  # collectives on their own stream, overlapping compute
            for j in range(k // 2, k, max(1, k // 4)):
                s = starts[j] + int(durations[j]) // 3
                self.op(
                    "kernel",
                    pid,
                    g,
                    s,
                    s + int(durations[j]),
                    stream=NCCL_STREAM,
                    call_start=starts[j] - 5 * US,
                    name=NCCL_KERNELS[name],
                    worker_range=idx,
                )
        if name == "update_weights":  # weights into the CUDA IPC buffer the rollout reads
            s = w_end - 140 * US
            self.op(
                "memcpy",
                pid,
                g,
                s,
                s + 60 * US,
                stream=COPY_STREAM,
                call_start=s - 8 * US,
                nbytes=64 << 20,
                copy_kind=COPY_KIND_D2D,
                worker_range=idx,
            )
        s = w_end - 60 * US
        self.op(
            "memcpy",
            pid,
            g,
            s,
            s + 40 * US,
            stream=COPY_STREAM,
            call_start=s - 8 * US,
            nbytes=1 << 20,
            copy_kind=COPY_KIND_D2H,
            worker_range=idx,
        )

    def rollout_gen(
        self, g: int, g_start: int, g_end: int, step: int, *, straddle_to: int | None
    ) -> None:
        """Prefill kernels, then decode steps (graph executions, every 6th an eager sampler)."""
        pid = ROLLOUT_PID0 + g
        idx = -1
        if self.cfg.rollout_ranges:
            idx = len(self.workers)
            tid = pid + ROLLOUT_TID_OFFSET
            name = "generate_sequences"
            self.workers.append(_Range(pid, tid, name, g_start, g_end, None, name, step))
        n = max(4, round(self.cfg.decode_steps * (1 - self.cfg.length_skew * g / self.cfg.gpus)))
        t = g_start + 20 * US
        weights = np.concatenate([[6.0, 4.0], self.rng.uniform(0.7, 1.3, size=n)])
        usable = g_end - 40 * US - t - len(weights) * 8 * US  # each starts 8 µs after its call
        durations = (weights / weights.sum() * usable * 0.85).astype(np.int64)
        gap = int(usable * 0.15 / len(weights))
        cursor, last = t, t
        half = n // 2
        for i, dur in enumerate(durations.tolist()):
            s = cursor + 8 * US
            e = s + dur
            if i < 2:  # prefill: eager attention and GEMM
                self.op(
                    "kernel",
                    pid,
                    g,
                    s,
                    e,
                    call_start=cursor,
                    name=COMPUTE_KERNELS[1 - i],
                    worker_range=idx,
                )
            elif self.cfg.graphs and (i - 2) % 6 != 5:
                graph = RAY_DECODE_GRAPHS[0 if i - 2 < half else 1]
                self.op("graph", pid, g, s, e, call_start=cursor, worker_range=idx, graph=graph)
            else:  # a decode step run eagerly, or the sampler between graph replays
                kernel = DECODE_KERNEL if not self.cfg.graphs else COMPUTE_KERNELS[3]
                self.op("kernel", pid, g, s, e, call_start=cursor, name=kernel, worker_range=idx)
            last = e
            cursor = e + gap
        if straddle_to is not None:  # the last decode step runs past the end of gen
            s = last + 8 * US
            if self.cfg.graphs:
                self.op(
                    "graph",
                    pid,
                    g,
                    s,
                    straddle_to,
                    call_start=last + 2 * US,
                    worker_range=idx,
                    graph=RAY_DECODE_GRAPHS[1],
                )
            else:
                self.op(
                    "kernel",
                    pid,
                    g,
                    s,
                    straddle_to,
                    call_start=last + 2 * US,
                    name=DECODE_KERNEL,
                    worker_range=idx,
                )
            last = straddle_to
        self.activity.append((g, g_start, last, ROLLOUT_POWER_W))

    def rollout_release(self, g: int, start: int) -> None:
        """The rollout frees its KV cache (kernels, memsets) while the trainer starts computing."""
        pid = ROLLOUT_PID0 + g
        t = start
        for i in range(6):
            dur = int(self.rng.integers(80, 160)) * US
            if i % 2:
                self.op("memset", pid, g, t, t + dur // 4, nbytes=256 << 20)
            else:
                self.op("kernel", pid, g, t, t + dur, name=COMPUTE_KERNELS[2])
            t += dur + 40 * US

    def rollout_weights(self, g: int, start: int, end: int) -> None:
        """The rollout loads the new weights (device copies) while the trainer broadcasts them."""
        pid = ROLLOUT_PID0 + g
        step = (end - start) // 4
        for i in range(4):
            s = start + i * step
            self.op(
                "memcpy",
                pid,
                g,
                s,
                s + int(step * 0.4),
                stream=COPY_STREAM,
                nbytes=256 << 20,
                copy_kind=COPY_KIND_D2D,
            )

    def build(self) -> None:
        """Lay out warm-up, the steps and keep-alives on the run clock."""
        cfg = self.cfg
        warmup = max(p.shift_ns for p in self.processes) + 1 * MS  # after every session started
        for p in self.processes[1:]:
            for i in range(3):
                s = warmup + i * 150 * US + (p.pid % 7) * 10 * US
                self.op("kernel", p.pid, p.gpu, s, s + 90 * US, name=COMPUTE_KERNELS[2])
        t = warmup + 5 * MS
        for step in range(1, cfg.steps + 1):
            step_start = t
            t += 50 * US
            phases = []
            for phase, worker, length_ms in RAY_PHASES:
                p_start = t
                p_end = p_start + int(length_ms * MS * self.rng.uniform(0.9, 1.1))
                phases.append((phase, p_start, p_end))
                next_start = p_end + PHASE_GAP_NS
                for g in range(cfg.gpus):
                    if phase == "gen":
                        span = int(
                            (p_end - p_start - 300 * US) * (1 - cfg.length_skew * g / cfg.gpus)
                        )
                        straddle = next_start + 300 * US if g == 0 else None  # into reward
                        self.rollout_gen(
                            g,
                            p_start + 100 * US,
                            p_start + 100 * US + span,
                            step,
                            straddle_to=straddle,
                        )
                    if phase == "old_log_prob":
                        self.rollout_release(g, p_start + 30 * US)
                    if phase == "update_weights":
                        self.rollout_weights(g, p_start + 400 * US, p_end - 300 * US)
                    if worker is not None:
                        self.trainer_range(g, worker, p_start + 100 * US, p_end - 150 * US, step)
                t = next_start
            step_end = t + 100 * US
            self.driver.append(
                _Range(DRIVER_PID, DRIVER_PID, "step", step_start, step_end, step, "step", step)
            )
            for phase, s, e in phases:
                self.driver.append(
                    _Range(DRIVER_PID, DRIVER_PID, phase, s, e, None, f"step/{phase}", step)
                )
            for g in range(cfg.gpus):  # the rollout server's keep-alive between steps
                s = step_end + 700 * US + g * 50 * US
                self.op("kernel", ROLLOUT_PID0 + g, g, s, s + 60 * US, name=COMPUTE_KERNELS[2])
            t = step_end + STEP_GAP_NS

    @property
    def duration(self) -> int:
        """Run length (ns on the run clock): the last event plus 1 ms."""
        return max(max(o.end for o in self.ops), max(r.end for r in self.driver)) + 1 * MS

    # --- power ------------------------------------------------------------------------------

    def cumulative_energy_j(self, g: int, t: np.ndarray) -> np.ndarray:
        """Energy (J) GPU ``g`` drew from instant 0 to each of ``t`` (exact)."""
        total = self.cfg.idle_power_w * t.astype(np.float64)
        for gpu, s, e, watts in self.activity:
            if gpu == g:
                total += watts * np.clip(t - s, 0, e - s)
        return total / 1e9

    def energy_j(self, g: int, start: int, end: int) -> float:
        """Exact energy (J) of GPU ``g`` over [start, end]."""
        total = self.cfg.idle_power_w * (end - start)
        for gpu, s, e, watts in self.activity:
            if gpu == g:
                total += watts * max(0, min(end, e) - max(start, s))
        return total / 1e9

    def sample_times(self) -> np.ndarray:
        """Instants (run clock) the sampler read every GPU."""
        return np.arange(0, self.duration + 1, self.cfg.power_interval_ns, dtype=np.int64)

    def clock_marks(self) -> list[tuple[int, int, int]]:
        """(run ns, sampler mono ns, sampler wall ns) of each clock mark in the driver."""
        cfg = self.cfg
        times = [*range(0, self.duration, cfg.clock_mark_every_ns), self.duration]
        wall = BASE_UTC_NS + cfg.power_wall_skew_ns
        return [(t, t + cfg.power_mono_offset_ns, wall + t) for t in times]

    def power_sampler(self) -> PowerSampler:
        """A sampler holding what NVML would have read: power, exact energy counter, UUID."""
        cfg = self.cfg
        sampler = PowerSampler()
        s = sampler.samples
        t = self.sample_times()
        for g in range(cfg.gpus):
            power = np.full(t.shape, cfg.idle_power_w)
            for gpu, start, end, watts in self.activity:
                if gpu == g:
                    power += np.where((t >= start) & (t < end), watts, 0.0)
            n = len(t)
            s["host"] += [cfg.host] * n
            s["pid"] += [DRIVER_PID] * n
            s["device"] += [g] * n
            s["uuid"] += [device_name(self.uuids[g])] * n
            s["wall_ns"] += (BASE_UTC_NS + cfg.power_wall_skew_ns + t).tolist()
            s["mono_ns"] += (t + cfg.power_mono_offset_ns).tolist()
            s["power_w"] += power.tolist()
            counter_mj = np.round(self.cumulative_energy_j(g, t) * 1000.0).astype(np.int64)
            s["energy_mj"] += counter_mj.tolist()
            s["sm_clock_mhz"] += [1980] * n
            s["gpu_util_pct"] += np.where(power > cfg.idle_power_w, 100, 0).tolist()
            s["mem_util_pct"] += [0] * n
        return sampler
