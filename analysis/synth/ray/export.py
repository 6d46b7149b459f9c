"""One nsys 2022.4-schema export per process of the Ray capture (plus the 2024.x graph table).

Each process writes its own export on its own session clock, seeing its one GPU as deviceId 0;
``TARGET_INFO_GPU`` says which physical GPU that is (UUID, bus location).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

from ..constants import BASE_UTC_NS, VM_ID
from ..export import ExportFile, Process, write_export
from ..schema import TABLES
from .config import BUS_LOCATIONS, RayProcess
from .model import RayBuilder

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
SYSTEM_ENV = (
    ("CpuCores", 1, "224"),
    ("CpuArchitecture", 3, "x86_64"),
    ("NvDriverVersion", 205, "550.54.15"),
    ("OsDescription", 605, "Ubuntu 22.04.4 LTS"),
    ("CudaDriverVersion", 611, "12040"),
)
RAY_TABLES = TABLES | {"TARGET_INFO_GPU"}


def iso_time(utc_ns: int) -> str:
    """``utcTime`` / ``localTime`` of a session that started at ``utc_ns``."""
    return datetime.fromtimestamp(utc_ns // 1_000_000_000, tz=timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S"
    )


def gpu_row(uuids: list[str], g: int) -> dict[str, object]:
    """The ``TARGET_INFO_GPU`` row of physical GPU ``g``, as the one GPU its process sees."""
    return {
        "vmId": VM_ID,
        "id": 0,  # the only GPU this process sees
        "name": GPU_NAME,
        "busLocation": BUS_LOCATIONS[g],
        **_GPU_PROPS_BEFORE_UUID,
        "pwGpuId": g,
        "uuid": uuids[g],
        **_GPU_PROPS_AFTER_UUID,
    }


class CaptureProcess(Protocol):
    """What one profiled process of a multi-export capture tells its export."""

    @property
    def pid(self) -> int:
        """The process id."""

    @property
    def name(self) -> str:
        """The process name."""

    @property
    def threads(self) -> tuple[tuple[int, str], ...]:
        """Its threads: (tid, name)."""

    @property
    def gpu(self) -> int | None:
        """Its physical GPU (None: a CPU process)."""

    @property
    def shift_ns(self) -> int:
        """How much later its session started than the first process's."""


def process_spec(
    proc: CaptureProcess,
    *,
    host: str,
    duration_ns: int,
    uuids: Sequence[str],
    launch_kinds: Iterable[str],
    generated_by: str,
) -> ExportFile:
    """One process's export file: its own session clock (``shift_ns`` later), its GPU as device 0.

    ``duration_ns`` is the capture's on the first process's clock; ``launch_kinds`` the kinds of
    the operations the process launched.
    """
    utc = BASE_UTC_NS + proc.shift_ns
    return ExportFile(
        processes=(Process(proc.pid, proc.name, proc.threads),),
        tables=RAY_TABLES if proc.gpu is not None else TABLES,
        shift_ns=proc.shift_ns,
        session_utc_ns=utc,
        session_iso=iso_time(utc),
        duration_ns=duration_ns - proc.shift_ns,
        host=host,
        generated_by=generated_by,
        env=(("Hostname", 619, host), *SYSTEM_ENV),
        launch_kinds=tuple(sorted(set(launch_kinds))),
        grid_x=132,  # an H100 SXM5's SMs
        local_device=True,
        gpu_row=None if proc.gpu is None else gpu_row(list(uuids), proc.gpu),
    )


def write_process(path: Path, b: RayBuilder, proc: RayProcess) -> None:
    """Write one process's export: its own session clock, its GPU as deviceId 0."""
    spec = process_spec(
        proc,
        host=b.cfg.host,
        duration_ns=b.duration,
        uuids=b.uuids,
        launch_kinds=(o.kind for o in b.ops if o.pid == proc.pid),
        generated_by=f"nvtx-phases analysis.synth.ray (Ray capture, {proc.role})",
    )
    write_export(path, spec, b, clock_marks=b.cfg.power)
