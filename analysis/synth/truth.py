"""Ground truth by brute force over the generated operations, independently of :mod:`analysis`.

The helpers (numpy clipping per range, a sort-merge union per GPU, the power model's exact
integral) serve both captures; :func:`ground_truth` is the GRPO run's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

from .config import WORKER_PID0
from .constants import COPY_KIND_D2H, COPY_KIND_H2D
from .memory import MemoryEvent
from .model import GrpoBuilder
from .timeline import GpuOp, Range, Timeline

GRAPH_NOTE = (
    "A CUDA graph execution (CUPTI_ACTIVITY_KIND_GRAPH_TRACE row, launched by "
    "cudaGraphLaunch_v10000) is one GPU operation of class cuda_graph: its time is counted in "
    "total_gpu_ns, gpu_busy_ns and graph_ns, never in kernel_ns or n_kernels (its kernels are "
    "not listed), and graphs are not in the kernels table."
)
#: The GRPO run's per-range metrics, in its ground truth's order (graph ones only with graphs).
_GRPO_METRICS = (
    "kernel_ns",
    "nccl_ns",
    "memcpy_ns",
    "memcpy_bytes",
    "memset_ns",
    "n_kernels",
    "graph_ns",
    "n_graphs",
    "gpu_busy_ns",
)

# --- shared by both captures -------------------------------------------------------------------


def union(starts: np.ndarray, ends: np.ndarray) -> int:
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


def op_arrays(ops: list[GpuOp]) -> dict[str, np.ndarray]:
    """Column arrays of ``ops``: start, end, kind, gpu, bytes, nccl (bool), wr (worker range)."""
    return {
        "start": np.array([x.start for x in ops], dtype=np.int64),
        "end": np.array([x.end for x in ops], dtype=np.int64),
        "kind": np.array([x.kind for x in ops]),
        "gpu": np.array([x.gpu for x in ops], dtype=np.int64),
        "bytes": np.array([x.nbytes for x in ops], dtype=np.int64),
        "nccl": np.array([x.name[0].startswith("nccl") for x in ops]),
        "wr": np.array([x.worker_range for x in ops], dtype=np.int64),
    }


def phase_metrics(
    a: dict[str, np.ndarray], s: int, e: int, mask: np.ndarray, *, clip: bool
) -> dict[str, int]:
    """Per-kind time, counts and busy time of the operations in ``mask`` for [s, e).

    ``clip``: time is clipped to [s, e) and counts are of operations starting inside it (window
    attribution); else operations count whole (projection). Busy time is always clipped: the
    union over each GPU of the operations' parts inside [s, e).
    """
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
            union(bs[inside & (a["gpu"] == g)], be[inside & (a["gpu"] == g)])
            for g in np.unique(a["gpu"]).tolist()
        ),
    }


def clipped_total(a: dict[str, np.ndarray], ranges: Iterable[Range]) -> int:
    """GPU time of all operations clipped to each of ``ranges``, summed over the ranges."""
    start, end = a["start"], a["end"]
    return sum(
        int(np.clip(np.minimum(end, r.end) - np.maximum(start, r.start), 0, None).sum())
        for r in ranges
    )


def op_tables(ops: list[GpuOp]) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """Count and total time per kernel (demangled name) and per graph (``graphId/execId``)."""
    kernels: dict[str, dict[str, int]] = {}
    graphs: dict[str, dict[str, int]] = {}
    for o in ops:
        if o.kind == "kernel":
            entry = kernels.setdefault(o.name[1], {"count": 0, "total_ns": 0})
        elif o.kind == "graph":
            entry = graphs.setdefault(f"{o.graph[0]}/{o.graph[1]}", {"count": 0, "total_ns": 0})
        else:
            continue
        entry["count"] += 1
        entry["total_ns"] += o.end - o.start
    return kernels, graphs


def energy_truth(tl: Timeline, gpus: range, labels: Sequence[str] | None = None) -> dict:
    """Exact energy per driver range and GPU, and totals, from the power model.

    ``per_device_j`` is a list in GPU order, or keyed by ``labels[gpu]``.
    """
    power = tl.power
    last = int(tl.sample_times()[-1])
    steps = [r for r in tl.driver if r.name == "step"]
    total = sum(power.energy_j(g, 0, last) for g in gpus)
    in_steps = sum(power.energy_j(g, r.start, r.end) for g in gpus for r in steps)

    def per_device(r: Range) -> list[float] | dict[str, float]:
        if labels is None:
            return [power.energy_j(g, r.start, r.end) for g in gpus]
        return {labels[g]: power.energy_j(g, r.start, r.end) for g in gpus}

    return {
        "energy": {
            "idle_power_w": power.knobs.idle_power_w,
            "total_energy_j": total,
            "attributed_energy_j": in_steps,
            "unattributed_energy_j": total - in_steps,
            "driver_phases": [
                {
                    "step": r.step,
                    "path": r.path,
                    "energy_j": sum(power.energy_j(g, r.start, r.end) for g in gpus),
                    "per_device_j": per_device(r),
                }
                for r in tl.driver
            ],
        }
    }


# --- the GRPO run --------------------------------------------------------------------------------


def ground_truth(b: GrpoBuilder, memory: Sequence[MemoryEvent] | None = None) -> dict:
    """Expected phase metrics, computed by clipping every op to every range (numpy).

    ``memory``: the CUDA memory events written (then ``memory`` per phase row and GPU too).
    """
    a = op_arrays(b.ops)
    start, end, kind, wr = a["start"], a["end"], a["kind"], a["wr"]
    keys = [k for k in _GRPO_METRICS if b.cfg.graphs or k not in ("graph_ns", "n_graphs")]

    def metrics(r: Range, mask: np.ndarray, *, clip: bool) -> dict[str, int]:
        m = phase_metrics(a, r.start, r.end, mask, clip=clip)
        return {k: m[k] for k in keys}

    everything = np.ones(len(start), dtype=bool)
    driver = [
        {
            "step": r.step,
            "phase": r.name,
            "path": r.path,
            "wall_ns": r.end - r.start,
            **metrics(r, everything, clip=True),
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
            **metrics(r, wr == i, clip=False),
        }
        for i, r in enumerate(b.workers)
    ]
    # window conservation: innermost driver range = the phase if inside one, else the step
    in_step = clipped_total(a, [r for r in b.driver if r.name == "step"])
    total = int((end - start).sum())
    return {
        "total_gpu_ns": total,
        "window_attributed_gpu_ns": in_step,  # phases and the gaps between them lie inside steps
        "window_in_phase_gpu_ns": clipped_total(a, [r for r in b.driver if r.name != "step"]),
        "window_unattributed_gpu_ns": total - in_step,
        "projection_attributed_gpu_ns": int((end - start)[wr >= 0].sum()),
        "projection_unattributed_gpu_ns": int((end - start)[wr < 0].sum()),
        "n_gpu_ops": len(start),
        "n_kernels": int((kind == "kernel").sum()),
        "n_steps": b.cfg.steps,
        **(_graph_totals(kind, start, end) if b.cfg.graphs else {}),
        "driver_phases": driver,
        "worker_phases": workers,
        "kernels": op_tables(b.ops)[0],
        **(energy_truth(b, range(b.cfg.ranks)) if b.cfg.power else {}),
        **({"memory": memory_truth(b, memory)} if memory is not None else {}),
    }


def _graph_totals(kind: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict:
    """Run totals of graph executions, and the note that says how they are counted."""
    graph = kind == "graph"
    return {
        "graph_ns": int((end - start)[graph].sum()),
        "n_graphs": int(graph.sum()),
        "notes": [GRAPH_NOTE],
    }


#: ``memKind`` ids of memory on the GPU (Device, Array, Device Static of ENUM_CUDA_MEM_KIND);
#: stated here again, not imported from the analysis
_ON_DEVICE = {2, 3, 5}


def memory_truth(b: GrpoBuilder, events: Sequence[MemoryEvent]) -> dict:
    """Device memory per phase row and GPU, by brute force over the rows written (plain Python).

    The level on a GPU starts at 0 at the capture's start and moves by each device-resident
    event's bytes (+ allocation, − free), in the rows' order (by time, then as written). Per row
    ``[start, end)`` and GPU: ``n_events`` inside, ``entry_bytes`` (after every event before
    ``start``), ``peak_bytes`` (entry and after each event inside), ``mean_bytes`` (exact ∫ level
    dt / wall, as a float), and the H2D/D2H bytes of the GPU's copies starting inside. Rows:
    every driver range on every GPU (window), every worker range on its own GPU (projection).
    """
    deltas: dict[int, list[tuple[int, int]]] = {g: [] for g in range(b.cfg.ranks)}
    for m in events:
        if m.mem_kind in _ON_DEVICE:
            deltas[m.gpu].append((m.ts, m.nbytes if m.operation == 0 else -m.nbytes))

    def row(r: Range, gpu: int) -> dict:
        entry = sum(d for ts, d in deltas[gpu] if ts < r.start)
        level, peak, area, at, n = entry, entry, 0, r.start, 0
        for ts, d in deltas[gpu]:
            if r.start <= ts < r.end:
                area += level * (ts - at)
                at, level, n = ts, level + d, n + 1
                peak = max(peak, level)
        area += level * (r.end - at)
        copies = [o for o in b.ops if o.kind == "memcpy" and o.gpu == gpu]
        moved = {
            name: sum(
                o.nbytes for o in copies if o.copy_kind == kind and r.start <= o.start < r.end
            )
            for name, kind in (("h2d_bytes", COPY_KIND_H2D), ("d2h_bytes", COPY_KIND_D2H))
        }
        return {
            "pid": r.pid,
            "step": r.step,
            "path": r.path,
            "gpu": gpu,
            "start_ns": r.start,
            "end_ns": r.end,
            "n_events": n,
            "entry_bytes": entry,
            "peak_bytes": peak,
            "mean_bytes": float(Fraction(area, r.end - r.start)),
            **moved,
        }

    return {
        "basis": "since_capture_start",
        "window": [row(r, g) for r in b.driver for g in range(b.cfg.ranks)],
        "projection": [row(r, r.pid - WORKER_PID0) for r in b.workers],
    }
