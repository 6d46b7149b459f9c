"""Ground truth of the Ray capture, by brute force over the generated operations."""

from __future__ import annotations

import numpy as np

from analysis.synth.build import (
    GRAPH_NOTE,
    _Range,
    _union,
)
from analysis.synth.ray.model import (
    BUS_LOCATIONS,
    RayBuilder,
    device_name,
)

# --- ground truth ----------------------------------------------------------------------------

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


def _arrays(b: RayBuilder) -> dict[str, np.ndarray]:
    o = b.ops
    return {
        "start": np.array([x.start for x in o], dtype=np.int64),
        "end": np.array([x.end for x in o], dtype=np.int64),
        "kind": np.array([x.kind for x in o]),
        "gpu": np.array([x.gpu for x in o], dtype=np.int64),
        "bytes": np.array([x.nbytes for x in o], dtype=np.int64),
        "nccl": np.array([x.name[0].startswith("nccl") for x in o]),
        "wr": np.array([x.worker_range for x in o], dtype=np.int64),
    }


def _metrics(a: dict[str, np.ndarray], s: int, e: int, mask: np.ndarray, *, clip: bool) -> dict:
    """Per-kind time, counts and busy time of the operations in ``mask`` for [s, e)."""
    start, end, kind = a["start"], a["end"], a["kind"]
    cs = np.maximum(start, s) if clip else start
    ce = np.minimum(end, e) if clip else end
    dur = np.where(mask, np.clip(ce - cs, 0, None), 0)
    counted = mask & (start >= s) & (start < e) if clip else mask
    bs, be = np.maximum(start, s), np.minimum(end, e)
    inside = mask & (be > bs)
    return {
        "kernel_ns": int(dur[kind == "kernel"].sum()),
        "nccl_ns": int(dur[(kind == "kernel") & a["nccl"]].sum()),
        "memcpy_ns": int(dur[kind == "memcpy"].sum()),
        "memcpy_bytes": int(a["bytes"][counted & (kind == "memcpy")].sum()),
        "memset_ns": int(dur[kind == "memset"].sum()),
        "graph_ns": int(dur[kind == "graph"].sum()),
        "n_kernels": int((counted & (kind == "kernel")).sum()),
        "n_graphs": int((counted & (kind == "graph")).sum()),
        "gpu_busy_ns": sum(
            _union(bs[inside & (a["gpu"] == g)], be[inside & (a["gpu"] == g)])
            for g in np.unique(a["gpu"]).tolist()
        ),
    }


def ray_ground_truth(b: RayBuilder) -> dict:
    """Expected metrics of the Ray capture, by brute force over the generated operations."""
    cfg = b.cfg
    a = _arrays(b)
    start, end, kind, gpu = a["start"], a["end"], a["kind"], a["gpu"]
    n_devices = len(np.unique(gpu))
    everything = np.ones(len(start), dtype=bool)
    driver, per_device = [], []
    for r in b.driver:
        wall = r.end - r.start
        m = _metrics(a, r.start, r.end, everything, clip=True)
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
        for g in range(cfg.gpus):
            dm = _metrics(a, r.start, r.end, gpu == g, clip=True)
            per_device.append(
                {
                    **head,
                    "device": device_name(b.uuids[g]),
                    "wall_ns": wall,
                    **dm,
                    "idle_ns": wall - dm["gpu_busy_ns"],
                }
            )
    workers = []
    for i, r in enumerate(b.workers):
        m = _metrics(a, r.start, r.end, a["wr"] == i, clip=False)
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

    def clipped_total(ranges: list[_Range]) -> int:
        return sum(
            int(np.clip(np.minimum(end, r.end) - np.maximum(start, r.start), 0, None).sum())
            for r in ranges
        )

    total = int((end - start).sum())
    in_step = clipped_total([r for r in b.driver if r.name == "step"])
    kernels: dict[str, dict[str, int]] = {}
    graphs: dict[str, dict[str, int]] = {}
    for o in b.ops:
        if o.kind == "kernel":
            entry = kernels.setdefault(o.name[1], {"count": 0, "total_ns": 0})
        elif o.kind == "graph":
            entry = graphs.setdefault(f"{o.graph[0]}/{o.graph[1]}", {"count": 0, "total_ns": 0})
        else:
            continue
        entry["count"] += 1
        entry["total_ns"] += o.end - o.start
    return {
        "total_gpu_ns": total,
        **{
            f"{k}_ns": int((end - start)[kind == k].sum())
            for k in ("kernel", "memcpy", "memset", "graph")
        },
        "nccl_ns": int((end - start)[(kind == "kernel") & a["nccl"]].sum()),
        "window_attributed_gpu_ns": in_step,
        "window_in_phase_gpu_ns": clipped_total([r for r in b.driver if r.name != "step"]),
        "window_unattributed_gpu_ns": total - in_step,
        "projection_attributed_gpu_ns": int((end - start)[a["wr"] >= 0].sum()),
        "projection_unattributed_gpu_ns": int((end - start)[a["wr"] < 0].sum()),
        "n_gpu_ops": len(start),
        "n_kernels": int((kind == "kernel").sum()),
        "n_graphs": int((kind == "graph").sum()),
        "n_steps": cfg.steps,
        "n_devices": n_devices,
        "devices": [
            {
                "device": device_name(b.uuids[g]),
                "uuid": b.uuids[g],
                "bus_location": BUS_LOCATIONS[g],
                "gpu_index": g,
                "total_gpu_ns": int((end - start)[gpu == g].sum()),
                "gpu_busy_ns": _union(start[gpu == g], end[gpu == g]),
            }
            for g in range(cfg.gpus)
        ],
        "driver_phases": driver,
        "phase_devices": per_device,
        "worker_phases": workers,
        "kernels": kernels,
        "graphs": graphs,
        **(_energy_truth(b) if cfg.power else {}),
    }


def _energy_truth(b: RayBuilder) -> dict:
    """Exact energy per driver range and physical GPU, and totals, from the power model."""
    gpus = range(b.cfg.gpus)
    last = int(b.sample_times()[-1])
    steps = [r for r in b.driver if r.name == "step"]
    total = sum(b.energy_j(g, 0, last) for g in gpus)
    in_steps = sum(b.energy_j(g, r.start, r.end) for g in gpus for r in steps)
    return {
        "energy": {
            "idle_power_w": b.cfg.idle_power_w,
            "total_energy_j": total,
            "attributed_energy_j": in_steps,
            "unattributed_energy_j": total - in_steps,
            "driver_phases": [
                {
                    "step": r.step,
                    "path": r.path,
                    "energy_j": sum(b.energy_j(g, r.start, r.end) for g in gpus),
                    "per_device_j": {
                        device_name(b.uuids[g]): b.energy_j(g, r.start, r.end) for g in gpus
                    },
                }
                for r in b.driver
            ],
        }
    }
