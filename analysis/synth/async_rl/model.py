"""The asynchronous capture's timeline: a trainer pool and a rollout pool working at once.

The run clock is the trainer controller's session clock. The trainer controller marks, per step,
``step`` with ``gen`` (waiting on the rollouter's queue), ``reward``, ``old_log_prob``, ``adv``,
``update_actor`` and ``param_sync``; the rollouter marks one ``version`` per parameter version
(they tile its timeline) with ``gen``, ``partial_pause`` or ``staleness_wait``, ``param_sync`` and,
first and last, ``validate``. Version ``v`` runs from the end of the weight update of step ``v`` to
the end of that of step ``v + 1``, so the rollout's ``gen`` overlaps the trainer's whole step.
Trainer workers run ``compute_log_prob``, ``update_actor`` (NCCL all-reduce) and ``weight_sync``
(NCCL broadcast); rollout servers run generation and validation kernels, clean up on a partial
pause, and receive the weights (NCCL broadcast, then device copies) during ``param_sync``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nvtx_phases.power import PowerSampler

from ..constants import (
    COMPUTE_KERNELS,
    COPY_KIND_D2D,
    COPY_STREAM,
    MS,
    NCCL_KERNELS,
    NCCL_STREAM,
    PHASE_GAP_NS,
    US,
)
from ..timeline import Range, Timeline
from .config import (
    ROLLOUT_PID0,
    ROLLOUT_TID_OFFSET,
    ROLLOUTER_PID,
    TRAINER_CONTROLLER_PID,
    TRAINER_PID0,
    AsyncConfig,
    AsyncProcess,
    async_processes,
    gpu_uuids,
)

#: Trainer phases after ``gen`` → (trainer worker range or None, length in ms).
TRAINER_PHASES: tuple[tuple[str, str | None, float], ...] = (
    ("reward", None, 2.0),
    ("old_log_prob", "compute_log_prob", 6.0),
    ("adv", None, 1.0),
    ("update_actor", "update_actor", 12.0),
    ("param_sync", "weight_sync", 3.0),
)
DECODE_KERNEL = (
    "flash_fwd_splitkv_kernel",
    "void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>, true>(Flash_fwd_params)",
)
#: The weights travel as one NCCL broadcast per bucket; the rollout's side receives them.
BROADCAST_KERNEL = NCCL_KERNELS["update_weights"]
WEIGHT_BUCKETS = 4
STEP_GAP_NS = 1 * MS
GEN_POWER_W, VALIDATE_POWER_W, SYNC_POWER_W, PAUSE_POWER_W = 300.0, 250.0, 150.0, 90.0
#: Sample counts of one trainer step's batch.
BATCH_SAMPLES = 32


@dataclass(frozen=True)
class SamplesMark:
    """What one trainer step trained on: its parameter version and its samples' versions."""

    t: int  # run clock
    step: int
    version: int
    versions: dict[int, int]


class AsyncBuilder(Timeline):
    """The generated run: processes, controller and worker ranges, GPU operations, power."""

    def __init__(self, cfg: AsyncConfig) -> None:
        if cfg.steps < 1 or cfg.trainer_gpus < 1 or cfg.rollout_gpus < 1:
            raise ValueError("steps, trainer_gpus and rollout_gpus must be ≥ 1")
        super().__init__(cfg, cfg.seed)
        self.cfg = cfg
        self.uuids = gpu_uuids(cfg)
        self.processes: list[AsyncProcess] = async_processes(cfg, self.rng)
        self.samples: list[SamplesMark] = []
        #: (pid, run-clock time) of each process's pool mark.
        self.pool_marks: dict[int, int] = {}

    def launch_tid(self, pid: int) -> int:
        """The rollout server launches from its engine thread, the others from their main one."""
        return pid + ROLLOUT_TID_OFFSET if pid >= ROLLOUT_PID0 else pid

    @property
    def trainer_gpus(self) -> range:
        """Physical indices of the trainer pool's GPUs."""
        return range(self.cfg.trainer_gpus)

    @property
    def rollout_gpus(self) -> range:
        """Physical indices of the rollout pool's GPUs."""
        return range(self.cfg.trainer_gpus, self.cfg.gpus)

    def server_pid(self, g: int) -> int:
        """The rollout server process of physical GPU ``g``."""
        return ROLLOUT_PID0 + g - self.cfg.trainer_gpus

    def _range(self, pid: int, name: str, start: int, end: int, payload: int, path: str) -> None:
        self.driver.append(Range(pid, pid, name, start, end, payload, path, payload))

    # --- layout --------------------------------------------------------------------------------

    def build(self) -> None:
        """Pool marks, warm-up, the trainer's steps, the rollouter's versions, the tail."""
        for p in self.processes:
            self.pool_marks[p.pid] = p.shift_ns + 40 * US + (p.pid % 13) * US
        t0 = max(p.shift_ns for p in self.processes) + 1 * MS  # every session has started
        for g in range(self.cfg.gpus):  # warm-up (CUDA graph capture, NCCL init): no range
            pid = TRAINER_PID0 + g if g < self.cfg.trainer_gpus else self.server_pid(g)
            for i in range(3):
                s = t0 + i * 150 * US + g * 10 * US
                self.op("kernel", pid, g, s, s + 90 * US, name=COMPUTE_KERNELS[2])
        syncs = self._trainer(t0 + 2500 * US, rollout_start=t0 + 2 * MS)
        self._rollouter(t0 + 2 * MS, syncs)

    # --- the trainer ---------------------------------------------------------------------------

    def _trainer(self, t: int, *, rollout_start: int) -> list[tuple[int, int]]:
        """Lay out the trainer's steps from ``t``; return each step's (param_sync start, end)."""
        cfg = self.cfg
        syncs = []
        # the first batch is ready once the rollout generated it, after its first validation
        ready = rollout_start + 2 * MS + 10 * MS
        for step in range(1, cfg.steps + 1):
            step_start = t
            gen_start = t + 50 * US
            if step > 1:  # the queue holds samples, or the trainer waits for them (even steps)
                wait = 4 * MS if step % 2 == 0 else 300 * US
                ready = gen_start + int(wait * self.rng.uniform(0.9, 1.1))
            gen_end = max(ready, gen_start + 300 * US)
            self._range(TRAINER_CONTROLLER_PID, "gen", gen_start, gen_end, step, "step/gen")
            self._samples(step, gen_end - 10 * US)
            t = gen_end + PHASE_GAP_NS
            for name, worker, length_ms in TRAINER_PHASES:
                end = t + int(length_ms * MS * self.rng.uniform(0.9, 1.1))
                self._range(TRAINER_CONTROLLER_PID, name, t, end, step, f"step/{name}")
                if worker == "weight_sync":
                    self._weight_sync(t, end, step)
                    syncs.append((t, end))
                elif worker is not None:
                    for g in self.trainer_gpus:
                        self.trainer_range(
                            TRAINER_PID0 + g,
                            g,
                            worker,
                            t + 100 * US,
                            end - 150 * US,
                            step,
                            kernels=cfg.kernels_per_phase,
                            tail={},
                        )
                t = end + PHASE_GAP_NS
            step_end = t - PHASE_GAP_NS + 100 * US
            self._range(TRAINER_CONTROLLER_PID, "step", step_start, step_end, step, "step")
            for g in self.trainer_gpus:  # a keep-alive between steps: outside every range
                s = step_end + 300 * US + g * 40 * US
                self.op("kernel", TRAINER_PID0 + g, g, s, s + 50 * US, name=COMPUTE_KERNELS[3])
            t = step_end + STEP_GAP_NS
        return syncs

    def _samples(self, step: int, t: int) -> None:
        """The samples mark of ``step``: version step-1, samples one or two versions old."""
        version = step - 1
        if step == 1:
            versions = {0: BATCH_SAMPLES}
        else:
            old = int(self.rng.integers(6, 20))
            versions = {version - 1: old, version: BATCH_SAMPLES - old}
            if step >= 3 and step % 2 == 1:  # a few samples from two versions back
                versions[version - 2] = 3
                versions[version] -= 3
        self.samples.append(SamplesMark(t, step, version, versions))

    def _broadcast_times(self, start: int, end: int) -> list[tuple[int, int]]:
        """(start, end) of each bucket's broadcast in a weight update over [start, end)."""
        span = (end - start) // WEIGHT_BUCKETS
        return [
            (start + i * span + 20 * US, start + i * span + int(span * 0.7))
            for i in range(WEIGHT_BUCKETS)
        ]

    def _weight_sync(self, start: int, end: int, step: int) -> None:
        """The trainer workers broadcast the new weights to the rollout servers."""
        w_start, w_end = start + 100 * US, end - 100 * US
        for g in self.trainer_gpus:
            pid = TRAINER_PID0 + g
            idx = self.add_worker_range(pid, "weight_sync", w_start, w_end, step)
            self.power.add(g, w_start, w_end, SYNC_POWER_W)
            for s, e in self._broadcast_times(w_start + 50 * US, w_end - 50 * US):
                self.op(
                    "kernel",
                    pid,
                    g,
                    s,
                    e,
                    stream=NCCL_STREAM,
                    name=BROADCAST_KERNEL,
                    worker_range=idx,
                )

    # --- the rollouter -------------------------------------------------------------------------

    def _rollouter(self, start: int, syncs: list[tuple[int, int]]) -> None:
        """The versions: generation, a pause until the trainer's update, the update itself."""
        v_start = start
        for v, (sync_start, sync_end) in enumerate(syncs):
            t = v_start + 50 * US
            if v == 0:
                t = self._validate(v, t, t + 2 * MS) + PHASE_GAP_NS
            pause_end = sync_start - 100 * US
            if v % 2 == 0:  # generating when the update comes: a partial pause
                gen_end = sync_start - 1 * MS
                self._gen(v, t, gen_end)
                self._range(
                    ROLLOUTER_PID,
                    "partial_pause",
                    gen_end + PHASE_GAP_NS,
                    pause_end,
                    v,
                    "version/partial_pause",
                )
                self._partial_pause(gen_end + PHASE_GAP_NS)
            else:  # the staleness limit reached: waiting for the trainer
                gen_end = t + int((sync_start - t) * 0.55)
                self._gen(v, t, gen_end)
                self._range(
                    ROLLOUTER_PID,
                    "staleness_wait",
                    gen_end + PHASE_GAP_NS,
                    pause_end,
                    v,
                    "version/staleness_wait",
                )
            v_end = sync_end + 100 * US  # loading the weights outlasts the broadcast
            self._range(ROLLOUTER_PID, "param_sync", sync_start, v_end, v, "version/param_sync")
            self._receive(sync_start, sync_end, v_end)
            self._range(ROLLOUTER_PID, "version", v_start, v_end, v, "version")
            v_start = v_end
        v = len(syncs)  # the last version: a little generation, the final validation
        t = v_start + 50 * US
        gen_end = t + 4 * MS
        self._gen(v, t, gen_end)
        end = self._validate(v, gen_end + PHASE_GAP_NS, gen_end + PHASE_GAP_NS + 3 * MS)
        self._range(ROLLOUTER_PID, "version", v_start, end + 100 * US, v, "version")
        for g in self.rollout_gpus:  # the engine's shutdown: after every range
            s = end + 800 * US + g * 30 * US
            self.op("kernel", self.server_pid(g), g, s, s + 70 * US, name=COMPUTE_KERNELS[2])

    def _validate(self, v: int, start: int, end: int) -> int:
        """A ``validate`` range over [start, end): generation kernels on every rollout GPU."""
        self._range(ROLLOUTER_PID, "validate", start, end, v, "version/validate")
        for g in self.rollout_gpus:
            self._kernels(g, start + 80 * US, end - 200 * US, 8, VALIDATE_POWER_W)
        return end

    def _gen(self, v: int, start: int, end: int) -> None:
        """A ``gen`` range: prefill, then decode kernels; shorter on later GPUs (length skew).

        On the pool's first GPU the last decode kernel runs 150 µs past the end of ``gen``.
        """
        self._range(ROLLOUTER_PID, "gen", start, end, v, "version/gen")
        cfg = self.cfg
        for i, g in enumerate(self.rollout_gpus):
            share = 1 - 0.25 * i / cfg.rollout_gpus
            g_end = start + 100 * US + int((end - start - 200 * US) * share)
            last = self._kernels(g, start + 100 * US, g_end, cfg.decode_kernels, GEN_POWER_W)
            if i == 0:
                pid = self.server_pid(g)
                s = last + 8 * US
                self.op(
                    "kernel",
                    pid,
                    g,
                    s,
                    end + 150 * US,
                    call_start=last + 2 * US,
                    name=DECODE_KERNEL,
                )
                self.power.add(g, last, end + 150 * US, GEN_POWER_W)

    def _kernels(self, g: int, start: int, end: int, n: int, watts: float) -> int:
        """Two prefill kernels, then ``n`` decode kernels over [start, end); the last end."""
        pid = self.server_pid(g)
        weights = np.concatenate([[5.0, 3.0], self.rng.uniform(0.7, 1.3, size=n)])
        usable = end - start - len(weights) * 8 * US
        durations = (weights / weights.sum() * usable * 0.85).astype(np.int64)
        gap = int(usable * 0.15 / len(weights))
        cursor = last = start
        for i, dur in enumerate(durations.tolist()):
            s = cursor + 8 * US
            last = s + dur
            name = COMPUTE_KERNELS[1 - i] if i < 2 else DECODE_KERNEL
            self.op("kernel", pid, g, s, last, call_start=cursor, name=name)
            cursor = last + gap
        self.power.add(g, start, last, watts)
        return last

    def _partial_pause(self, start: int) -> None:
        """In-flight requests aborted: their KV cache blocks freed (a kernel and a memset)."""
        for g in self.rollout_gpus:
            pid = self.server_pid(g)
            self.op("kernel", pid, g, start + 60 * US, start + 180 * US, name=COMPUTE_KERNELS[2])
            self.op("memset", pid, g, start + 200 * US, start + 240 * US, nbytes=128 << 20)
            self.power.add(g, start + 60 * US, start + 240 * US, PAUSE_POWER_W)

    def _receive(self, sync_start: int, sync_end: int, v_end: int) -> None:
        """The rollout's side of the broadcast, then each bucket copied into the engine."""
        w_start, w_end = sync_start + 100 * US, sync_end - 100 * US
        buckets = self._broadcast_times(w_start + 50 * US, w_end - 50 * US)
        for g in self.rollout_gpus:
            pid = self.server_pid(g)
            for s, e in buckets:
                self.op(
                    "kernel",
                    pid,
                    g,
                    s + 3 * US,
                    e + 5 * US,
                    stream=NCCL_STREAM,
                    name=BROADCAST_KERNEL,
                )
                c = e + 15 * US
                self.op(
                    "memcpy",
                    pid,
                    g,
                    c,
                    c + 60 * US,
                    stream=COPY_STREAM,
                    nbytes=512 << 20,
                    copy_kind=COPY_KIND_D2D,
                )
            self.power.add(g, buckets[0][0], v_end - 20 * US, SYNC_POWER_W)

    # --- power ---------------------------------------------------------------------------------

    def power_sampler(self) -> PowerSampler:
        """A sampler holding what NVML would have read of every GPU: power, energy, UUID."""
        sampler = PowerSampler()
        t = self.sample_times()
        for g in range(self.cfg.gpus):
            uuid = f"GPU-{self.uuids[g]}"
            self.power.append_samples(sampler.samples, g, t, host=self.cfg.host, uuid=uuid)
        return sampler
