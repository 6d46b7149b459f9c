"""The Ray capture's knobs and its processes: who runs where, on which clock, in which file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ..constants import DRIVER_PID, MS, US

TRAINER_PID0 = 2000
ROLLOUT_PID0 = 3000
#: The rollout server launches from its engine thread, not its main thread.
ROLLOUT_TID_OFFSET = 1
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


def ray_processes(cfg: RayConfig, rng: np.random.Generator) -> list[RayProcess]:
    """The driver, then per GPU its trainer worker and its rollout server.

    Process k starts its session about ``k * cfg.session_stagger_ns`` after the driver, plus a
    jitter under 97 µs drawn from ``rng``.
    """
    processes = [
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
        jitter = [int(j) for j in rng.integers(0, 97 * US, size=2)]
        t_pid, r_pid = TRAINER_PID0 + g, ROLLOUT_PID0 + g
        processes += [
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
    return processes
