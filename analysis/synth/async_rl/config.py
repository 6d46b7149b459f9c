"""The asynchronous capture's knobs and its processes: who runs where, on which clock, in which file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..constants import DRIVER_PID, MS, US
from ..ray.config import BUS_LOCATIONS, nsys_uuid

#: The trainer controller (``FullyAsyncTrainer``) is the run clock's process: the driver's pid.
TRAINER_CONTROLLER_PID = DRIVER_PID
ROLLOUTER_PID = 1100
TRAINER_PID0 = 2000
ROLLOUT_PID0 = 3000
#: The rollout server launches from its engine thread, not its main thread.
ROLLOUT_TID_OFFSET = 1

Role = Literal["trainer_controller", "rollouter", "trainer", "rollout"]


@dataclass(frozen=True)
class AsyncConfig:
    """Knobs of the synthetic asynchronous capture (defaults: 3 trainer steps, 2 + 2 GPUs)."""

    steps: int = 3
    #: GPUs of the trainer pool (one trainer worker process each).
    trainer_gpus: int = 2
    #: GPUs of the rollout pool (one rollout server process each), after the trainer's on the host.
    rollout_gpus: int = 2
    seed: int = 11
    #: Compute kernels per trainer worker range.
    kernels_per_phase: int = 24
    #: Decode kernels per rollout ``gen`` range on each server.
    decode_kernels: int = 30
    #: The rollout servers' GPU operations are not in their exports (their processes, pool marks
    #: and power are): rollout kernels that nsys did not capture.
    untraced_rollout: bool = False
    host: str = "async-h100-node-0"
    #: Process k (trainer controller 0, rollouter 1, then workers and servers) starts its
    #: capture about k times this later than the trainer controller.
    session_stagger_ns: int = 500 * US
    #: Write NVML power samples of every GPU (``power_nvml.parquet``, sampler in the trainer
    #: controller, whose NVTX holds the clock marks).
    power: bool = True
    power_interval_ns: int = 100 * US
    idle_power_w: float = 70.0
    power_mono_offset_ns: int = 98_765_432_000
    power_wall_skew_ns: int = 1_200_000
    clock_mark_every_ns: int = 20 * MS

    @property
    def gpus(self) -> int:
        """Physical GPUs on the host: the trainer pool's, then the rollout pool's."""
        return self.trainer_gpus + self.rollout_gpus


@dataclass(frozen=True)
class AsyncProcess:
    """One profiled process: one export file."""

    pid: int
    role: Role
    #: The pool it belongs to: ``trainer`` or ``rollout``.
    pool: str
    gpu: int | None
    name: str
    threads: tuple[tuple[int, str], ...]
    file: str
    shift_ns: int  # its session started this much later than the trainer controller's


def gpu_uuids(cfg: AsyncConfig) -> list[str]:
    """UUID (as nsys stores it: no ``GPU-`` prefix) of each physical GPU, from the seed."""
    return [nsys_uuid(np.random.default_rng([cfg.seed, 28, g])) for g in range(cfg.gpus)]


def async_processes(cfg: AsyncConfig, rng: np.random.Generator) -> list[AsyncProcess]:
    """The two controllers, then per trainer GPU its worker, then per rollout GPU its server."""
    if cfg.gpus > len(BUS_LOCATIONS):
        raise ValueError(f"at most {len(BUS_LOCATIONS)} GPUs on the host")
    specs: list[tuple[int, Role, str, int | None, str, str]] = [
        (
            TRAINER_CONTROLLER_PID,
            "trainer_controller",
            "trainer",
            None,
            "ray::FullyAsyncTrainer",
            "trainer_controller.sqlite",
        ),
        (
            ROLLOUTER_PID,
            "rollouter",
            "rollout",
            None,
            "ray::FullyAsyncRollouter",
            "rollouter.sqlite",
        ),
    ]
    for g in range(cfg.trainer_gpus):
        specs.append(
            (TRAINER_PID0 + g, "trainer", "trainer", g, "ray::WorkerDict", f"trainer_gpu{g}.sqlite")
        )
    for r in range(cfg.rollout_gpus):
        g = cfg.trainer_gpus + r
        specs.append(
            (
                ROLLOUT_PID0 + r,
                "rollout",
                "rollout",
                g,
                "ray::vLLMHttpServer",
                f"rollout_gpu{g}.sqlite",
            )
        )
    jitter = [int(j) for j in rng.integers(0, 83 * US, size=len(specs))]
    processes = []
    for k, (pid, role, pool, gpu, name, file) in enumerate(specs):
        threads: tuple[tuple[int, str], ...] = ((pid, name),)
        if role == "rollout":
            threads = (*threads, (pid + ROLLOUT_TID_OFFSET, "EngineCore"))
        shift = 0 if k == 0 else k * cfg.session_stagger_ns + jitter[k]
        processes.append(AsyncProcess(pid, role, pool, gpu, name, threads, file, shift))
    return processes
