"""A synthetic Ray-style VeRL capture: one nsys export per process, two processes per GPU.

Under Ray, VeRL runs a driver process (the trainer loop: ``step`` and phase ranges in domain
``verl``, no GPU work) and, per GPU, a trainer worker (``compute_log_prob``, ``update_actor``,
``update_weights`` ranges around its kernels, NCCL collectives and copies) and a rollout server
process (generation kernels and CUDA graph launches; an inference server marks no worker range
around them unless ``rollout_ranges``). Profiled under Ray, nsys writes one export per process,
each on its own session clock (``TARGET_INFO_SESSION_START_TIME`` staggered by process start),
and each process sees its one GPU as ``deviceId`` 0. Only ``TARGET_INFO_GPU`` says which physical
GPU that is: its ``uuid`` (the trainer's and the rollout's export of one GPU carry the same one)
and ``busLocation``; ``TARGET_INFO_SYSTEM_ENV`` names the host (the same in every export).

nsys stores the UUID without NVML's ``GPU-`` prefix (a real 2024.5 export:
``cf6b97c0-bf53-a39e-febd-9532190b5766``), and so does this generator; the NVML power sampler
records ``GPU-<uuid>`` (:mod:`nvtx_phases.power`), and the ground truth names each physical GPU
that way (``device``).

Deliberate features, each with ground truth: trainer and rollout kernels overlapping on one GPU
(the rollout releasing its KV cache while ``compute_log_prob`` starts, and loading weights while
the trainer broadcasts them in ``update_weights``), NCCL overlapping compute, decode steps as CUDA
graph executions (``CUPTI_ACTIVITY_KIND_GRAPH_TRACE``, launched by ``cudaGraphLaunch_v10000``)
with one straddling the end of ``gen`` into the gap and ``reward``, GPU-free phases, warm-up
and keep-alive kernels outside every step, generation length skew across GPUs, and optional
NVML power samples with exact energy. The tables are those of a real nsys 2022.4.2 export
(``schema/``) plus the graph table of nsys 2024.x.

The ground truth (``ground_truth.json``) is computed by brute force from the generated operation
list (numpy clipping and a sort-merge union per physical GPU), independently of :mod:`analysis`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from ..constants import BASE_UTC_NS
from .config import (
    BUS_LOCATIONS,
    RayConfig,
    RayProcess,
    device_name,
    nsys_uuid,
)
from .export import write_process
from .model import RayBuilder, RayOp
from .truth import RAY_NOTES, ray_ground_truth


def generate_ray(
    out_dir: str | Path, cfg: RayConfig | None = None, *, with_truth: bool = True
) -> list[Path]:
    """Write the Ray capture into ``out_dir``; return the export paths (driver first).

    Files: ``driver.sqlite``, ``trainer_gpu{g}.sqlite`` and ``rollout_gpu{g}.sqlite`` per GPU,
    ``ground_truth.json`` and, with ``cfg.power``, ``power_nvml.parquet``.
    """
    cfg = cfg or RayConfig()
    b = RayBuilder(cfg)
    b.build()
    out = Path(out_dir)
    written = write_exports(
        out, [(proc.file, partial(write_process, b=b, proc=proc)) for proc in b.processes]
    )
    if cfg.power:
        b.power_sampler().write_parquet(out / "power_nvml.parquet")
    if with_truth:
        write_truth(out, cfg, RAY_NOTES, b.processes, b.uuids, ray_ground_truth(b))
    return written


def write_exports(out: Path, files: Sequence[tuple[str, Callable[[Path], None]]]) -> list[Path]:
    """Write each ``(file name, writer)`` of a capture into ``out`` (created); the paths, in order."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, write in files:
        write(out / name)
        written.append(out / name)
    return written


def write_truth(
    out: Path,
    cfg: Any,
    notes: Sequence[str],
    processes: Sequence[Any],
    uuids: Sequence[str],
    truth: dict[str, Any],
) -> None:
    """``ground_truth.json`` of a per-process capture: config, notes, each file's clock, truth.

    Each file's row names its process's ``pool`` too where processes have one (async capture).
    """
    files = []
    for p in processes:
        row: dict[str, Any] = {"file": p.file, "role": p.role}
        if hasattr(p, "pool"):
            row["pool"] = p.pool
        row |= {
            "pid": p.pid,
            "device": None if p.gpu is None else device_name(uuids[p.gpu]),
            "session_start_utc_ns": BASE_UTC_NS + p.shift_ns,
            "clock_offset_ns": p.shift_ns,
        }
        files.append(row)
    record = {
        "config": asdict(cfg),
        "notes": list(notes),
        "capture": {"host": cfg.host, "files": files},
        **truth,
    }
    (out / "ground_truth.json").write_text(json.dumps(record, indent=1) + "\n")


__all__ = [
    "BUS_LOCATIONS",
    "RayConfig",
    "RayOp",
    "RayProcess",
    "device_name",
    "generate_ray",
    "nsys_uuid",
    "ray_ground_truth",
    "write_truth",
]
