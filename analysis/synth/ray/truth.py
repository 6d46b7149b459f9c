"""Ground truth of the Ray capture, by brute force over the generated operations."""

from __future__ import annotations

import numpy as np

from ..truth import (
    GRAPH_NOTE,
    clipped_total,
    energy_truth,
    op_arrays,
    op_tables,
    phase_metrics,
    union,
)
from .config import BUS_LOCATIONS, device_name
from .model import RayBuilder

RAY_NOTES = (
    "Times are ns on the run clock: the driver's session clock, the earliest session. A file's "
    "timestamps are run time minus its clock_offset_ns (its TARGET_INFO_SESSION_START_TIME minus "
    "the driver's).",
    "device names a physical GPU as 'GPU-' + the UUID nsys stores in TARGET_INFO_GPU.uuid (which "
    "has no 'GPU-' prefix); every process's export calls its GPU deviceId 0, and a trainer and a "
    "rollout process share each GPU.",
    "driver_phases (window attribution): every GPU operation of every process clipped to the "
    "driver range's interval; gpu_busy_ns = sum over physical GPUs of the union of all operations "
    "of all processes on that GPU inside the interval (operations of two processes overlapping "
    "on one GPU count once); n_devices = number of physical GPUs of the run; "
    "idle_ns = wall_ns * n_devices - gpu_busy_ns; n_kernels, n_graphs and memcpy_bytes count "
    "operations starting inside the interval.",
    "window_in_phase_gpu_ns / window_attributed_gpu_ns: GPU time inside a driver phase (the "
    "innermost range wins) / inside a step; window_unattributed_gpu_ns is outside every step.",
    "worker_phases (projection): operations whose launch call lies inside the worker range on "
    "the launching thread, counted whole; gpu_busy_ns only inside the range's interval.",
    GRAPH_NOTE,
)


def ray_ground_truth(b: RayBuilder) -> dict:
    """Expected metrics of the Ray capture, by brute force over the generated operations."""
    cfg = b.cfg
    a = op_arrays(b.ops)
    start, end, kind, wr = a["start"], a["end"], a["kind"], a["wr"]
    driver, per_device = _driver_phases(b, a)
    total = int((end - start).sum())
    in_step = clipped_total(a, [r for r in b.driver if r.name == "step"])
    kernels, graphs = op_tables(b.ops)
    return {
        "total_gpu_ns": total,
        **{
            f"{k}_ns": int((end - start)[kind == k].sum())
            for k in ("kernel", "memcpy", "memset", "graph")
        },
        "nccl_ns": int((end - start)[(kind == "kernel") & a["nccl"]].sum()),
        "window_attributed_gpu_ns": in_step,
        "window_in_phase_gpu_ns": clipped_total(a, [r for r in b.driver if r.name != "step"]),
        "window_unattributed_gpu_ns": total - in_step,
        "projection_attributed_gpu_ns": int((end - start)[wr >= 0].sum()),
        "projection_unattributed_gpu_ns": int((end - start)[wr < 0].sum()),
        "n_gpu_ops": len(start),
        "n_kernels": int((kind == "kernel").sum()),
        "n_graphs": int((kind == "graph").sum()),
        "n_steps": cfg.steps,
        "n_devices": len(np.unique(a["gpu"])),
        "devices": _devices(b, a),
        "driver_phases": driver,
        "phase_devices": per_device,
        "worker_phases": _worker_phases(b, a),
        "kernels": kernels,
        "graphs": graphs,
        **(
            energy_truth(b, range(cfg.gpus), [device_name(u) for u in b.uuids]) if cfg.power else {}
        ),
    }


def _driver_phases(b: RayBuilder, a: dict[str, np.ndarray]) -> tuple[list[dict], list[dict]]:
    """Window metrics of each driver range, over all GPUs and per physical GPU."""
    n_devices = len(np.unique(a["gpu"]))
    everything = np.ones(len(a["start"]), dtype=bool)
    driver: list[dict] = []
    per_device: list[dict] = []
    for r in b.driver:
        wall = r.end - r.start
        m = phase_metrics(a, r.start, r.end, everything, clip=True)
        head = {"step": r.step, "phase": r.name, "path": r.path}
        driver.append(
            {
                **head,
                "start_ns": r.start,
                "end_ns": r.end,
                "wall_ns": wall,
                **m,
                "idle_ns": wall * n_devices - m["gpu_busy_ns"],
                "n_devices": n_devices,
            }
        )
        for g in range(b.cfg.gpus):
            dm = phase_metrics(a, r.start, r.end, a["gpu"] == g, clip=True)
            per_device.append(
                {
                    **head,
                    "device": device_name(b.uuids[g]),
                    "wall_ns": wall,
                    **dm,
                    "idle_ns": wall - dm["gpu_busy_ns"],
                }
            )
    return driver, per_device


def _worker_phases(b: RayBuilder, a: dict[str, np.ndarray]) -> list[dict]:
    """Projection metrics of each worker range: the operations launched inside it, whole."""
    workers: list[dict] = []
    for i, r in enumerate(b.workers):
        m = phase_metrics(a, r.start, r.end, a["wr"] == i, clip=False)
        g = b.ops[int(np.flatnonzero(a["wr"] == i)[0])].gpu
        workers.append(
            {
                "pid": r.pid,
                "device": device_name(b.uuids[g]),
                "step": r.step,
                "phase": r.name,
                "path": r.path,
                "start_ns": r.start,
                "end_ns": r.end,
                "wall_ns": r.end - r.start,
                **m,
                "n_devices": 1,
            }
        )
    return workers


def _devices(b: RayBuilder, a: dict[str, np.ndarray]) -> list[dict]:
    """Each physical GPU: its names, its total GPU time and its busy time."""
    start, end, gpu = a["start"], a["end"], a["gpu"]
    return [
        {
            "device": device_name(b.uuids[g]),
            "uuid": b.uuids[g],
            "bus_location": BUS_LOCATIONS[g],
            "gpu_index": g,
            "total_gpu_ns": int((end - start)[gpu == g].sum()),
            "gpu_busy_ns": union(start[gpu == g], end[gpu == g]),
        }
        for g in range(b.cfg.gpus)
    ]
