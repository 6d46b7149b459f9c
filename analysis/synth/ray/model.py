"""The Ray capture's timeline: per GPU a trainer worker and a rollout server, on the run clock.

The run clock is the driver's session clock. Every GPU runs the trainer worker's ranges
(:meth:`~analysis.synth.timeline.Timeline.trainer_range`) and the rollout server's work:
generation (prefill kernels, then decode steps as graph executions or eager kernels), releasing
its KV cache while ``compute_log_prob`` starts, and loading weights while the trainer broadcasts
them; warm-up kernels before the first step and keep-alive kernels between steps.
"""

from __future__ import annotations

import numpy as np

from nvtx_phases.power import PowerSampler

from ..constants import (
    COMPUTE_KERNELS,
    COPY_KIND_D2D,
    COPY_STREAM,
    MS,
    US,
)
from ..timeline import GpuOp, PhaseSpan, TailCopies, Timeline
from .config import (
    BUS_LOCATIONS,
    ROLLOUT_PID0,
    ROLLOUT_TID_OFFSET,
    TRAINER_PID0,
    RayConfig,
    RayProcess,
    device_name,
    nsys_uuid,
    ray_processes,
)

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
ROLLOUT_POWER_W = 300.0
#: The trainer writes the new weights into the CUDA IPC buffer the rollout reads.
_TAIL_COPIES: TailCopies = {"update_weights": (64 << 20, COPY_KIND_D2D, 60 * US)}
#: One GPU operation of the Ray capture (the shared operation record).
RayOp = GpuOp


class RayBuilder(Timeline):
    """The generated run: processes, driver and worker ranges, GPU operations, power windows."""

    graph_call_ns = 12 * US

    def __init__(self, cfg: RayConfig) -> None:
        if cfg.gpus < 1 or cfg.gpus > len(BUS_LOCATIONS) or cfg.steps < 1:
            msg = f"gpus must be 1..{len(BUS_LOCATIONS)} and steps ≥ 1"
            raise ValueError(msg)
        super().__init__(cfg, cfg.seed)
        self.cfg = cfg
        self.uuids = [nsys_uuid(np.random.default_rng([cfg.seed, g])) for g in range(cfg.gpus)]
        self.processes: list[RayProcess] = ray_processes(cfg, self.rng)

    def launch_tid(self, pid: int) -> int:
        """The rollout server launches from its engine thread, the others from their main one."""
        return pid + ROLLOUT_TID_OFFSET if pid >= ROLLOUT_PID0 else pid

    # --- layout --------------------------------------------------------------------------------

    def build(self) -> None:
        """Lay out warm-up, the steps and keep-alives on the run clock."""
        warmup = max(p.shift_ns for p in self.processes) + 1 * MS  # after every session started
        for p in self.processes:
            if p.gpu is None:
                continue
            for i in range(3):
                s = warmup + i * 150 * US + (p.pid % 7) * 10 * US
                self.op("kernel", p.pid, p.gpu, s, s + 90 * US, name=COMPUTE_KERNELS[2])
        self.lay_steps(warmup + 5 * MS, self.cfg.steps, RAY_PHASES)

    def phase(self, span: PhaseSpan) -> None:
        """Per GPU: the rollout's part of the phase, then the trainer's worker range."""
        cfg = self.cfg
        start, end = span.start, span.end
        for g in range(cfg.gpus):
            if span.name == "gen":
                length = int((end - start - 300 * US) * (1 - cfg.length_skew * g / cfg.gpus))
                straddle = span.next_start + 300 * US if g == 0 else None  # into reward
                w_start = start + 100 * US
                self.rollout_gen(g, w_start, w_start + length, span.step, straddle_to=straddle)
            if span.name == "old_log_prob":
                self.rollout_release(g, start + 30 * US)
            if span.name == "update_weights":
                self.rollout_weights(g, start + 400 * US, end - 300 * US)
            if span.worker is not None:
                self.trainer_range(
                    TRAINER_PID0 + g,
                    g,
                    span.worker,
                    start + 100 * US,
                    end - 150 * US,
                    span.step,
                    kernels=cfg.kernels_per_phase,
                    tail=_TAIL_COPIES,
                )

    def after_step(self, step_end: int) -> None:
        """The rollout server's keep-alive kernel between steps."""
        for g in range(self.cfg.gpus):
            s = step_end + 700 * US + g * 50 * US
            self.op("kernel", ROLLOUT_PID0 + g, g, s, s + 60 * US, name=COMPUTE_KERNELS[2])

    # --- the rollout server --------------------------------------------------------------------

    def rollout_gen(
        self, g: int, g_start: int, g_end: int, step: int, *, straddle_to: int | None
    ) -> None:
        """Prefill kernels, then decode steps (graph executions, every 6th an eager sampler)."""
        pid = ROLLOUT_PID0 + g
        idx = -1
        if self.cfg.rollout_ranges:
            tid = pid + ROLLOUT_TID_OFFSET
            idx = self.add_worker_range(pid, "generate_sequences", g_start, g_end, step, tid=tid)
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
            graphs = self.cfg.graphs
            self.op(
                "graph" if graphs else "kernel",
                pid,
                g,
                last + 8 * US,
                straddle_to,
                call_start=last + 2 * US,
                name=("", "") if graphs else DECODE_KERNEL,
                worker_range=idx,
                graph=RAY_DECODE_GRAPHS[1] if graphs else (0, 0),
            )
            last = straddle_to
        self.power.add(g, g_start, last, ROLLOUT_POWER_W)

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

    # --- power ---------------------------------------------------------------------------------

    def power_sampler(self) -> PowerSampler:
        """A sampler holding what NVML would have read: power, exact energy counter, UUID."""
        sampler = PowerSampler()
        t = self.sample_times()
        for g in range(self.cfg.gpus):
            uuid = device_name(self.uuids[g])
            self.power.append_samples(sampler.samples, g, t, host=self.cfg.host, uuid=uuid)
        return sampler
